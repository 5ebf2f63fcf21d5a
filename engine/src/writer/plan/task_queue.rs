//! Planning the task queues (docs/TASKS-DESIGN.md §1.6): an enqueue appends one message
//! with the next qseq (a retry with its dedupe key is a no-op while it is queued); a dequeue
//! takes the oldest messages without waiting (an empty queue answers at once and writes
//! nothing), and a retry with its token gets the same batch again.

use super::task::owned;
use crate::api::{TaskDequeue, TaskDequeued, TaskEnqueue, TaskEnqueued};
use crate::error::{Error, Result};
use crate::index::{TaskRead, Txn};
use crate::record::{Record, TaskDequeued as Dequeued, TaskQueued};
use crate::writer::Writer;

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
        let queued = state.tail - state.head;
        if queued >= u64::from(max_len) {
            return Err(Error::TaskQueueFull {
                task_id: req.task.task_id,
                what: "messages",
                queued: queued + 1,
                max: u64::from(max_len),
            });
        }
        let bytes = state.bytes + req.message.len() as u64;
        if bytes > u64::from(limits.queue_bytes_max) {
            return Err(Error::TaskQueueFull {
                task_id: req.task.task_id,
                what: "bytes",
                queued: bytes,
                max: u64::from(limits.queue_bytes_max),
            });
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
