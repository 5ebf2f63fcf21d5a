//! Applies the task records to the index (docs/TASKS-DESIGN.md §1.3, §2.2). Blind, like
//! the rest of apply: a record for a task the index does not hold (replay of a log whose
//! oldest segments were retired, before the task's snapshot arrives) changes nothing, and
//! the snapshot then replaces every content key of the task.

use crate::error::Result;
use crate::index::TaskRoute;
use crate::index::{
    ended_key, origin_key, owner_task_key, task_deadline_key, task_id_key, task_key, task_marker,
    task_outcome_key, task_request_key, task_slot_key, Counts, StoredTask, TaskRead, Txn,
};
use crate::record::{
    QueueSnapshot, TaskCreated, TaskDeleted, TaskDequeued, TaskEnded, TaskInputAnswered,
    TaskInputRequested, TaskQueued, TaskRoutes, TaskSnapshot, TaskUpdated,
};
use crate::task::{
    InputSlot, OutcomeKind, QueuedMessage, SlotState, TaskMeta, TaskStatus, INBOUND, OUTBOUND,
};

/// The task `id` as the index holds it, unless it is unknown or deleted.
fn live(txn: &Txn<'_>, id: u64) -> Result<Option<StoredTask>> {
    Ok(txn.stored_task(id)?.filter(|t| !t.meta.is_deleted()))
}

/// Writes `t` back after a change at `at_ms` that moved it to `version`.
fn put_changed(txn: &mut Txn<'_>, mut t: StoredTask, version: u64, at_ms: u64) {
    t.meta.version = t.meta.version.max(version);
    t.meta.updated_at_ms = t.meta.updated_at_ms.max(at_ms);
    txn.put_task(&t);
}

/// Moves the task's TTL key from `old` to the deadline `meta` has now.
fn move_deadline(txn: &mut Txn<'_>, old: Option<u64>, meta: &TaskMeta) {
    let new = meta.deadline_ms().filter(|_| !meta.is_deleted());
    if old != new {
        if let Some(d) = old {
            txn.remove_raw(task_deadline_key(d, meta.id).to_vec());
        }
        if let Some(d) = new {
            txn.put_raw(task_deadline_key(d, meta.id).to_vec(), Vec::new());
        }
    }
}

/// Drops the task's outstanding input requests (a cancel request or its end).
fn drop_outstanding(txn: &mut Txn<'_>, id: u64) -> Result<()> {
    for mut slot in txn.task_slots(id)? {
        if slot.state == SlotState::Outstanding {
            slot.state = SlotState::Dropped;
            txn.put_task_slot(id, &slot);
        }
    }
    Ok(())
}

pub(super) fn created(txn: &mut Txn<'_>, lsn: u64, c: &TaskCreated) -> Result<()> {
    let meta = TaskMeta {
        id: c.id,
        owner: c.owner.clone(),
        task_id: c.task_id.clone(),
        request_key: c.request_key.clone(),
        status: TaskStatus::Working,
        status_message: c.status_message.clone(),
        version: 1,
        created_at_ms: c.at_ms,
        updated_at_ms: c.at_ms,
        ttl_ms: c.ttl_ms,
        poll_interval_ms: c.poll_interval_ms,
        worker_lease_ms: c.worker_lease_ms,
        cancel_requested: false,
        ended_at_ms: None,
        end_cause: None,
        deleted_at_ms: None,
        removal: None,
        outcome_kind: OutcomeKind::None,
        context: c.context.clone(),
    };
    put_whole(txn, meta, Vec::new(), Vec::new(), Vec::new(), lsn)
}

pub(super) fn queued(txn: &mut Txn<'_>, q: &TaskQueued) -> Result<()> {
    let Some(t) = live(txn, q.id)? else {
        return Ok(());
    };
    let mut state = txn.queue_state(q.id, q.channel)?;
    if q.qseq <= state.tail {
        return Ok(());
    }
    if let Some(c) = &q.correlation {
        route(txn, &t.meta.owner, c, q)?;
    }
    state.tail = q.qseq;
    state.bytes += q.message.len() as u64;
    txn.put_queued_message(
        q.id,
        q.channel,
        &QueuedMessage {
            qseq: q.qseq,
            at_ms: q.at_ms,
            dedupe_key: q.dedupe_key.clone(),
            correlation: q.correlation.clone(),
            message: q.message.clone(),
        },
    );
    txn.put_queue_state(q.id, q.channel, &state);
    Ok(())
}

/// The route side of a queued message with a correlation (docs/TASKS-DESIGN.md §1.6): an
/// outbound request opens the route of its answer (unless the owner's correlation has one
/// already); the inbound answer closes its task's open route, keeping the answer's qseq for a
/// retry of the routing call.
fn route(txn: &mut Txn<'_>, owner: &str, correlation: &str, q: &TaskQueued) -> Result<()> {
    let current = txn.task_route(owner, correlation)?;
    match q.channel {
        OUTBOUND if current.is_none() => txn.put_task_route(
            owner,
            correlation,
            TaskRoute {
                id: q.id,
                inbound_qseq: None,
            },
        )?,
        INBOUND => {
            if let Some(r) = current.filter(|r| r.id == q.id && r.inbound_qseq.is_none()) {
                txn.put_task_route(
                    owner,
                    correlation,
                    TaskRoute {
                        inbound_qseq: Some(q.qseq),
                        ..r
                    },
                )?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Replaces the routes of a live task with those carried forward (after its snapshot).
pub(super) fn routes(txn: &mut Txn<'_>, r: &TaskRoutes) -> Result<()> {
    let Some(t) = live(txn, r.id)? else {
        return Ok(());
    };
    let owner = &t.meta.owner;
    txn.remove_task_routes(r.id, owner)?;
    for e in &r.routes {
        txn.put_task_route(
            owner,
            &e.correlation,
            TaskRoute {
                id: r.id,
                inbound_qseq: e.inbound_qseq,
            },
        )?;
    }
    Ok(())
}

pub(super) fn dequeued(txn: &mut Txn<'_>, d: &TaskDequeued) -> Result<()> {
    if live(txn, d.id)?.is_none() {
        return Ok(());
    }
    let mut state = txn.queue_state(d.id, d.channel)?;
    let mut batch = Vec::new();
    for qseq in state.head + 1..=d.through_qseq.min(state.tail) {
        if let Some(m) = txn.queued_message(d.id, d.channel, qseq)? {
            txn.remove_queued_message(d.id, d.channel, &m);
            state.bytes = state.bytes.saturating_sub(m.message.len() as u64);
            batch.push(m);
        }
    }
    state.head = state.head.max(d.through_qseq.min(state.tail));
    state.last_token = Some(d.token.clone());
    txn.put_last_batch(d.id, d.channel, batch);
    txn.put_queue_state(d.id, d.channel, &state);
    Ok(())
}

pub(super) fn updated(txn: &mut Txn<'_>, u: &TaskUpdated) -> Result<()> {
    let Some(mut t) = live(txn, u.id)? else {
        return Ok(());
    };
    if t.meta.status.is_terminal() {
        return Ok(());
    }
    let old_deadline = t.meta.deadline_ms();
    t.meta.status = u.status;
    if u.status_message.is_some() {
        t.meta.status_message.clone_from(&u.status_message);
    }
    if u.ttl_ms.is_some() {
        t.meta.ttl_ms = u.ttl_ms;
    }
    if let Some(p) = u.poll_interval_ms {
        t.meta.poll_interval_ms = p;
    }
    move_deadline(txn, old_deadline, &t.meta);
    put_changed(txn, t, u.version, u.at_ms);
    Ok(())
}

pub(super) fn input_requested(txn: &mut Txn<'_>, r: &TaskInputRequested) -> Result<()> {
    let Some(mut t) = live(txn, r.id)? else {
        return Ok(());
    };
    if t.meta.status.is_terminal() {
        return Ok(());
    }
    for (key, request) in &r.requests {
        txn.put_task_slot(
            r.id,
            &InputSlot {
                key: key.clone(),
                request: request.clone(),
                response: None,
                state: SlotState::Outstanding,
            },
        );
    }
    t.meta.status = TaskStatus::InputRequired;
    if r.status_message.is_some() {
        t.meta.status_message.clone_from(&r.status_message);
    }
    put_changed(txn, t, r.version, r.at_ms);
    Ok(())
}

pub(super) fn input_answered(txn: &mut Txn<'_>, a: &TaskInputAnswered) -> Result<()> {
    let Some(mut t) = live(txn, a.id)? else {
        return Ok(());
    };
    for (key, response) in &a.responses {
        if let Some(mut slot) = txn.task_slot(a.id, key)? {
            if slot.state == SlotState::Outstanding {
                slot.state = SlotState::Answered;
                slot.response = Some(response.clone());
                txn.put_task_slot(a.id, &slot);
            }
        }
    }
    let waiting = txn
        .task_slots(a.id)?
        .iter()
        .any(|s| s.state == SlotState::Outstanding);
    if !waiting && t.meta.status == TaskStatus::InputRequired {
        t.meta.status = TaskStatus::Working;
    }
    put_changed(txn, t, a.version, a.at_ms);
    Ok(())
}

pub(super) fn cancel_requested(txn: &mut Txn<'_>, id: u64, version: u64, at_ms: u64) -> Result<()> {
    let Some(mut t) = live(txn, id)? else {
        return Ok(());
    };
    if t.meta.status.is_terminal() {
        return Ok(());
    }
    t.meta.cancel_requested = true;
    if t.meta.status == TaskStatus::InputRequired {
        t.meta.status = TaskStatus::Working;
    }
    drop_outstanding(txn, id)?;
    put_changed(txn, t, version, at_ms);
    Ok(())
}

pub(super) fn ended(txn: &mut Txn<'_>, e: &TaskEnded) -> Result<()> {
    let Some(mut t) = live(txn, e.id)? else {
        return Ok(());
    };
    if t.meta.status.is_terminal() {
        return Ok(());
    }
    let old_deadline = t.meta.deadline_ms();
    t.meta.status = e.status;
    t.meta.end_cause = Some(e.cause);
    t.meta.ended_at_ms = Some(e.at_ms);
    if e.status_message.is_some() {
        t.meta.status_message.clone_from(&e.status_message);
    }
    t.meta.outcome_kind = e.outcome.kind;
    if !e.outcome.json.is_empty() {
        txn.put_raw(task_outcome_key(e.id).to_vec(), e.outcome.json.clone());
    }
    drop_outstanding(txn, e.id)?;
    move_deadline(txn, old_deadline, &t.meta);
    put_changed(txn, t, e.version, e.at_ms);
    Ok(())
}

pub(super) fn deleted(txn: &mut Txn<'_>, d: &TaskDeleted) -> Result<()> {
    let Some(mut t) = live(txn, d.id)? else {
        return Ok(());
    };
    drop_content(txn, &t.meta)?;
    txn.remove_task_routes(d.id, &t.meta.owner)?;
    txn.count_owner_task(&t.meta.owner, -1)?;
    txn.count(Counts {
        live_tasks: -1,
        ..Counts::default()
    });
    t.meta.deleted_at_ms = Some(d.at_ms);
    t.meta.removal = Some(d.removal);
    let (kind, id) = task_marker(d.id);
    txn.put_raw(ended_key(d.at_ms, kind, &id), Vec::new());
    txn.put_task(&t);
    Ok(())
}

/// Removes what a deleted task no longer has: its outcome, inputs, queues, request key,
/// listing entry and TTL key. Its record (the tombstone) and its task id stay. Its routes are
/// not content a snapshot restates (they come in their own record after it): deletion and
/// forgetting remove them. `meta` is the task
/// as it was before deletion.
fn drop_content(txn: &mut Txn<'_>, meta: &TaskMeta) -> Result<()> {
    txn.remove_raw(task_outcome_key(meta.id).to_vec());
    for slot in txn.task_slots(meta.id)? {
        txn.remove_raw(task_slot_key(meta.id, &slot.key));
    }
    txn.remove_raw(task_request_key(&meta.owner, &meta.request_key));
    txn.remove_raw(owner_task_key(&meta.owner, meta.id));
    if let Some(d) = meta.deadline_ms() {
        txn.remove_raw(task_deadline_key(d, meta.id).to_vec());
    }
    txn.remove_queues(meta.id)
}

pub(super) fn snapshot(txn: &mut Txn<'_>, lsn: u64, s: &TaskSnapshot) -> Result<()> {
    put_whole(
        txn,
        s.meta.clone(),
        s.outcome.clone(),
        s.slots.clone(),
        s.queues.clone(),
        lsn,
    )
}

/// Replaces every key of task `meta.id` with the state given (a creation or a snapshot).
fn put_whole(
    txn: &mut Txn<'_>,
    meta: TaskMeta,
    outcome: Vec<u8>,
    slots: Vec<InputSlot>,
    queues: Vec<QueueSnapshot>,
    lsn: u64,
) -> Result<()> {
    let id = meta.id;
    let (kind, marker) = task_marker(id);
    let old = txn.stored_task(id)?;
    let old_live = old.as_ref().is_some_and(|o| !o.meta.is_deleted());
    if let Some(old) = &old {
        txn.remove_raw(origin_key(old.origin_lsn, kind, &marker));
        if let Some(at) = old.meta.deleted_at_ms {
            txn.remove_raw(ended_key(at, kind, &marker));
        }
        if old_live {
            drop_content(txn, &old.meta)?;
            txn.count_owner_task(&old.meta.owner, -1)?;
            if meta.is_deleted() {
                txn.remove_task_routes(id, &old.meta.owner)?;
            }
        }
    }
    let live = !meta.is_deleted();
    txn.count(Counts {
        tasks: i64::from(old.is_none()),
        live_tasks: i64::from(live) - i64::from(old_live),
        ..Counts::default()
    });
    txn.put_raw(origin_key(lsn, kind, &marker), Vec::new());
    txn.put_raw(
        task_id_key(&meta.owner, &meta.task_id),
        id.to_le_bytes().to_vec(),
    );
    if let Some(at) = meta.deleted_at_ms {
        txn.put_raw(ended_key(at, kind, &marker), Vec::new());
    } else {
        txn.put_raw(
            task_request_key(&meta.owner, &meta.request_key),
            id.to_le_bytes().to_vec(),
        );
        txn.put_raw(owner_task_key(&meta.owner, id), Vec::new());
        txn.count_owner_task(&meta.owner, 1)?;
        move_deadline(txn, None, &meta);
        if !outcome.is_empty() {
            txn.put_raw(task_outcome_key(id).to_vec(), outcome);
        }
        for slot in &slots {
            txn.put_task_slot(id, slot);
        }
        for q in queues {
            for m in &q.messages {
                txn.put_queued_message(id, q.channel, m);
            }
            txn.put_last_batch(id, q.channel, q.last_batch);
            txn.put_queue_state(id, q.channel, &q.state);
        }
    }
    txn.put_task(&StoredTask {
        meta,
        origin_lsn: lsn,
    });
    Ok(())
}

pub(super) fn forgotten(txn: &mut Txn<'_>, id: u64) -> Result<()> {
    let Some(t) = txn.stored_task(id)? else {
        return Ok(());
    };
    let (kind, marker) = task_marker(id);
    let live = !t.meta.is_deleted();
    if live {
        drop_content(txn, &t.meta)?;
        txn.remove_task_routes(id, &t.meta.owner)?;
        txn.count_owner_task(&t.meta.owner, -1)?;
    }
    if let Some(at) = t.meta.deleted_at_ms {
        txn.remove_raw(ended_key(at, kind, &marker));
    }
    txn.remove_raw(origin_key(t.origin_lsn, kind, &marker));
    txn.remove_raw(task_id_key(&t.meta.owner, &t.meta.task_id));
    txn.remove_raw(task_key(id).to_vec());
    txn.count(Counts {
        tasks: -1,
        live_tasks: -i64::from(live),
        ..Counts::default()
    });
    Ok(())
}
