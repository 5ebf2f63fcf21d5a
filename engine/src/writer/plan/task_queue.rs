//! Planning the task queues (docs/TASKS-DESIGN.md §1.6): an enqueue appends one message
//! with the next qseq (a retry with its dedupe key is a no-op while it is queued); a dequeue
//! takes the oldest messages without waiting (an empty queue answers at once and writes
//! nothing), and a retry with its token gets the same batch again.
//!
//! Routing (the inbound channel) appends a client's answer to the inbound queue of the task
//! whose outbound request opened the route (owner, correlation), closing the route in the
//! same record: an answer is routed once; a retry finds the closed route and its qseq.

use super::task::owned;
use crate::api::{TaskDequeue, TaskDequeued, TaskEnqueue, TaskEnqueued, TaskRoute, TaskRouted};
use crate::error::{Error, Result};
use crate::index::{TaskRead, Txn};
use crate::record::{Record, TaskDequeued as Dequeued, TaskQueued};
use crate::task::{QueueState, INBOUND, OUTBOUND};
use crate::writer::Writer;

/// Most inbound routes (open and answered) one task holds: each outbound request with a
/// correlation opens one, kept until the task is deleted. At the cap, such an enqueue is
/// refused as a full queue. Bounds a task's [`crate::record::TaskRoutes`] record (4096 ×
/// at most `id_bytes_max` + 18 bytes).
pub(crate) const TASK_ROUTES_MAX: u64 = 4096;

/// Whether a queue in `state` has room for one more message of `len` bytes, under the
/// enqueuer's `max_len` and the server's byte bound.
fn room(state: &QueueState, max_len: u32, len: usize, bytes_max: u32, task_id: &str) -> Result<()> {
    let queued = state.tail - state.head;
    if queued >= u64::from(max_len) {
        return Err(Error::TaskQueueFull {
            task_id: task_id.to_owned(),
            what: "messages",
            queued: queued + 1,
            max: u64::from(max_len),
        });
    }
    let bytes = state.bytes + len as u64;
    if bytes > u64::from(bytes_max) {
        return Err(Error::TaskQueueFull {
            task_id: task_id.to_owned(),
            what: "bytes",
            queued: bytes,
            max: u64::from(bytes_max),
        });
    }
    Ok(())
}

impl Writer {
    pub(in crate::writer) fn enqueue_task_message(
        &mut self,
        req: TaskEnqueue,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskEnqueued> {
        let t = owned(txn, &req.task)?;
        let id = t.meta.id;
        if let Some(d) = &req.dedupe_key {
            if let Some(qseq) = txn.deduped(id, req.channel, d)? {
                return Ok(TaskEnqueued {
                    qseq,
                    duplicate: true,
                });
            }
        }
        let limits = &self.shared.config.tasks;
        let max_len = match req.max_len {
            0 => limits.queue_len_max,
            n => n.min(limits.queue_len_max),
        };
        let state = txn.queue_state(id, req.channel)?;
        room(
            &state,
            max_len,
            req.message.len(),
            limits.queue_bytes_max,
            &req.task.task_id,
        )?;
        if let Some(c) = &req.correlation {
            check_correlation(txn, &t.meta.owner, id, req.channel, c, &req.task.task_id)?;
        }
        let qseq = state.tail + 1;
        self.emit(
            vec![Record::TaskQueued(TaskQueued {
                id,
                channel: req.channel,
                qseq,
                max_len,
                dedupe_key: req.dedupe_key,
                correlation: req.correlation,
                message: req.message,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(TaskEnqueued {
            qseq,
            duplicate: false,
        })
    }

    pub(in crate::writer) fn dequeue_task_messages(
        &mut self,
        req: TaskDequeue,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskDequeued> {
        let t = owned(txn, &req.task)?;
        let id = t.meta.id;
        let state = txn.queue_state(id, req.channel)?;
        if state.last_token.as_deref() == Some(req.token.as_str()) {
            return Ok(TaskDequeued {
                messages: txn.last_batch(id, req.channel)?,
                duplicate: true,
            });
        }
        let waiting = state.tail - state.head;
        if waiting == 0 {
            return Ok(TaskDequeued {
                messages: Vec::new(),
                duplicate: false,
            });
        }
        let take = match req.max_messages {
            0 => waiting,
            n => waiting.min(u64::from(n)),
        };
        self.emit(
            vec![Record::TaskDequeued(Dequeued {
                id,
                channel: req.channel,
                through_qseq: state.head + take,
                token: req.token,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(TaskDequeued {
            messages: txn.last_batch(id, req.channel)?,
            duplicate: false,
        })
    }
}

/// An enqueue's correlation: an outbound request opens a route, so its correlation must be
/// the owner's alone (a repeat for the same task with its route still open is fine: an
/// enqueue retried after its message was taken), within the task's route cap. An inbound one
/// is a routed answer, which only [`Writer::route_task_message`] writes.
fn check_correlation(
    txn: &Txn<'_>,
    owner: &str,
    id: u64,
    channel: u8,
    correlation: &str,
    task_id: &str,
) -> Result<()> {
    if channel == INBOUND {
        return Err(Error::invalid(
            "correlation",
            "an inbound answer to a request is routed (RouteTaskMessage), not enqueued",
        ));
    }
    debug_assert_eq!(channel, OUTBOUND);
    match txn.task_route(owner, correlation)? {
        Some(r) if r.id == id && r.inbound_qseq.is_none() => Ok(()),
        Some(_) => Err(Error::invalid(
            "correlation",
            format!("{correlation:?} names an earlier request of this owner; JSON-RPC ids are not reused"),
        )),
        None => {
            let routes = txn.task_route_count(id)?;
            if routes >= TASK_ROUTES_MAX {
                return Err(Error::TaskQueueFull {
                    task_id: task_id.to_owned(),
                    what: "routes",
                    queued: routes + 1,
                    max: TASK_ROUTES_MAX,
                });
            }
            Ok(())
        }
    }
}

impl Writer {
    pub(in crate::writer) fn route_task_message(
        &mut self,
        req: TaskRoute,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskRouted> {
        let not_routed = TaskRouted {
            routed: false,
            task_id: String::new(),
            qseq: 0,
            duplicate: false,
        };
        let Some(route) = txn.task_route(&req.owner, &req.correlation)? else {
            return Ok(not_routed);
        };
        // Deletion removes a task's routes, so the task is there; a tombstone routes nothing.
        let Some(t) = txn.stored_task(route.id)?.filter(|t| !t.meta.is_deleted()) else {
            return Ok(not_routed);
        };
        if let Some(qseq) = route.inbound_qseq {
            return Ok(TaskRouted {
                routed: true,
                task_id: t.meta.task_id,
                qseq,
                duplicate: true,
            });
        }
        // An ended task's worker waits for no answer any more: nobody would take it.
        if t.meta.status.is_terminal() {
            return Ok(not_routed);
        }
        let limits = &self.shared.config.tasks;
        let max_len = limits.queue_len_max;
        let state = txn.queue_state(route.id, INBOUND)?;
        room(
            &state,
            max_len,
            req.message.len(),
            limits.queue_bytes_max,
            &t.meta.task_id,
        )?;
        let qseq = state.tail + 1;
        self.emit(
            vec![Record::TaskQueued(TaskQueued {
                id: route.id,
                channel: INBOUND,
                qseq,
                max_len,
                dedupe_key: None,
                correlation: Some(req.correlation),
                message: req.message,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(TaskRouted {
            routed: true,
            task_id: t.meta.task_id,
            qseq,
            duplicate: false,
        })
    }
}
