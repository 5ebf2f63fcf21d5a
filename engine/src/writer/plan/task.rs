//! Planning the task writes (docs/TASKS-DESIGN.md §1.3, §1.4, §1.8): each request is
//! checked against the current state (index plus this group's earlier requests) and turned
//! into at most one record, carrying the task's next version. Callers get precise errors
//! here; the apply rules (`validate/task.rs`) check the same again on every replica.

use crate::api::{
    CancelMode, CreatedTask, InputAnswered, NewTask, TaskCancel, TaskCancelled, TaskChange,
    TaskFinish, TaskInputAnswer, TaskInputRequest, TaskRef, TaskWritten,
};
use crate::clock::duration_ms;
use crate::error::{Error, LiveLimit, Result};
use crate::index::{StoredTask, TaskRead, Txn};
use crate::mailbox::{Reply, TaskCommand, TaskReply};
use crate::record::{
    Record, TaskCancelRequested, TaskCreated, TaskDeleted, TaskEnded, TaskInputAnswered,
    TaskInputRequested, TaskUpdated,
};
use crate::task::{may_move, EndCause, SlotState, TaskMeta, TaskRemoval, TaskStatus};
use crate::writer::Writer;

/// What one input slot costs of a task's `input_bytes_max`: its key, request, response and
/// the fields around them.
pub(crate) fn slot_bytes(key: &str, request: usize, response: usize) -> u64 {
    (key.len() + request + response + 32) as u64
}

impl Writer {
    pub(in crate::writer) fn plan_task(
        &mut self,
        cmd: TaskCommand,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<Reply> {
        let reply = match cmd {
            TaskCommand::Create(req) => TaskReply::Created(self.create_task(req, txn, buf, now)?),
            TaskCommand::Change(req) => TaskReply::Written(self.change_task(req, txn, buf, now)?),
            TaskCommand::RequestInput(req) => {
                TaskReply::Written(self.request_input(req, txn, buf, now)?)
            }
            TaskCommand::Answer(req) => TaskReply::Answered(self.answer_input(req, txn, buf, now)?),
            TaskCommand::Cancel(req) => TaskReply::Cancelled(self.cancel_task(req, txn, buf, now)?),
            TaskCommand::Finish(req) => TaskReply::Written(self.finish_task(req, txn, buf, now)?),
            TaskCommand::Delete(req) => TaskReply::Written(self.delete_task(&req, txn, buf, now)?),
            TaskCommand::Enqueue(req) => {
                TaskReply::Enqueued(self.enqueue_task_message(req, txn, buf, now)?)
            }
            TaskCommand::Dequeue(req) => {
                TaskReply::Dequeued(self.dequeue_task_messages(req, txn, buf, now)?)
            }
            TaskCommand::Route(req) => {
                TaskReply::Routed(self.route_task_message(req, txn, buf, now)?)
            }
            TaskCommand::Expire(id) => TaskReply::Expired(self.expire_task(id, txn, buf, now)?),
            TaskCommand::LeaseExpired(id) => {
                TaskReply::Expired(self.fail_leaseless_task(id, txn, buf, now)?)
            }
            TaskCommand::Fence {
                id,
                past_version,
                why,
            } => TaskReply::Expired(self.fence_task(id, past_version, why, txn, buf, now)?),
            TaskCommand::PadLsns { through_lsn, max } => {
                TaskReply::Expired(self.pad_lsns(through_lsn, max, txn, buf)?)
            }
        };
        Ok(Reply::Task(Box::new(reply)))
    }

    fn create_task(
        &mut self,
        req: NewTask,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<CreatedTask> {
        if let Some(id) = txn.task_by_request_key(&req.owner, &req.request_key)? {
            if let Some(t) = txn.stored_task(id)? {
                return Ok(CreatedTask {
                    task: t.meta,
                    created: false,
                });
            }
        }
        if txn.task_by_task_id(&req.owner, &req.task_id)?.is_some() {
            return Err(Error::TaskExists {
                task_id: req.task_id,
            });
        }
        let limits = &self.shared.config.tasks;
        let owned = txn.owner_task_count(&req.owner)?;
        if owned >= limits.per_owner_max {
            return Err(Error::AtCapacity {
                limit: LiveLimit::TasksPerOwner,
                max: limits.per_owner_max,
            });
        }
        let live = self.shared.index.counts().live_tasks + txn.pending_counts().live_tasks;
        if u64::try_from(live).unwrap_or(0) >= limits.tasks_max {
            return Err(Error::AtCapacity {
                limit: LiveLimit::Tasks,
                max: limits.tasks_max,
            });
        }
        let ttl_max = duration_ms(limits.ttl_max);
        let ttl_ms = req
            .ttl_ms
            .unwrap_or_else(|| duration_ms(limits.ttl_default))
            .min(ttl_max);
        let poll_interval_ms = req
            .poll_interval_ms
            .unwrap_or_else(|| duration_ms(limits.poll_interval_default));
        let id = self.log.next_lsn();
        let lease = req.worker_lease_ms;
        self.emit(
            vec![Record::TaskCreated(TaskCreated {
                id,
                owner: req.owner,
                task_id: req.task_id,
                request_key: req.request_key,
                ttl_ms: Some(ttl_ms),
                poll_interval_ms,
                worker_lease_ms: req.worker_lease_ms,
                status_message: req.status_message,
                context: req.context,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        if let Some(ms) = lease {
            // Armed by the writer, so a worker that dies before its first renewal still
            // loses the task at the lease's end (a refused entry leaves a lease on no task:
            // its expiry finds nothing to do).
            self.shared.task_leases.arm(id, ms, now);
        }
        Ok(CreatedTask {
            task: written(txn, id)?,
            created: true,
        })
    }

    fn change_task(
        &mut self,
        req: TaskChange,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskWritten> {
        let t = running(txn, &req.task, req.expected_version)?;
        self.shared.task_leases.renew(t.meta.id, now);
        if req.status.is_terminal() || !may_move(t.meta.status, req.status) {
            return Err(Error::invalid(
                "status",
                format!(
                    "a change moves a running task to working or input_required, not {}; \
                     end a task with its outcome (finish)",
                    req.status
                ),
            ));
        }
        let id = t.meta.id;
        let ttl_ms = req
            .ttl_ms
            .map(|ms| ms.min(duration_ms(self.shared.config.tasks.ttl_max)));
        let restates = |current: &TaskMeta| {
            current.status == req.status
                && req
                    .status_message
                    .as_ref()
                    .is_none_or(|m| current.status_message.as_ref() == Some(m))
                && ttl_ms.is_none_or(|ms| current.ttl_ms == Some(ms))
                && req
                    .poll_interval_ms
                    .is_none_or(|p| current.poll_interval_ms == p)
        };
        if restates(&t.meta) {
            // A retry, or a worker restating where it is: nothing is written, so its version
            // does not move and its watchers are not woken (tasks.proto `duplicate`; issue
            // 30 item 7). The lease was renewed above, as by any call of its worker.
            return Ok(TaskWritten {
                task: t.meta,
                duplicate: true,
            });
        }
        self.emit(
            vec![Record::TaskUpdated(TaskUpdated {
                id,
                version: t.meta.version + 1,
                status: req.status,
                status_message: req.status_message,
                ttl_ms,
                poll_interval_ms: req.poll_interval_ms,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(TaskWritten {
            task: written(txn, id)?,
            duplicate: false,
        })
    }

    fn request_input(
        &mut self,
        req: TaskInputRequest,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskWritten> {
        let t = running(txn, &req.task, None)?;
        let id = t.meta.id;
        self.shared.task_leases.renew(id, now);
        let mut held: u64 = txn
            .task_slots(id)?
            .iter()
            .map(|s| {
                slot_bytes(
                    &s.key,
                    s.request.len(),
                    s.response.as_ref().map_or(0, Vec::len),
                )
            })
            .sum();
        for (i, (key, request)) in req.requests.iter().enumerate() {
            if txn.task_slot(id, key)?.is_some() || req.requests[..i].iter().any(|(k, _)| k == key)
            {
                return Err(Error::invalid(
                    "requests",
                    format!(
                        "input key {key:?} was used before in this task; keys are never reused"
                    ),
                ));
            }
            held += slot_bytes(key, request.len(), 0);
        }
        let limit = u64::from(self.shared.config.tasks.input_bytes_max);
        if held > limit {
            return Err(Error::TooLarge {
                what: "input requests and answers of the task (bytes)",
                got: held,
                limit,
            });
        }
        self.emit(
            vec![Record::TaskInputRequested(TaskInputRequested {
                id,
                version: t.meta.version + 1,
                requests: req.requests,
                status_message: req.status_message,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(TaskWritten {
            task: written(txn, id)?,
            duplicate: false,
        })
    }

    fn answer_input(
        &mut self,
        req: TaskInputAnswer,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<InputAnswered> {
        let t = owned(txn, &req.task)?;
        let id = t.meta.id;
        let mut accepted = Vec::new();
        let mut ignored = Vec::new();
        let mut responses = Vec::new();
        let mut held: u64 = 0;
        for (key, response) in req.responses {
            let slot = if t.meta.status.is_terminal() || accepted.contains(&key) {
                None
            } else {
                txn.task_slot(id, &key)?
                    .filter(|s| s.state == SlotState::Outstanding)
            };
            match slot {
                Some(_) => {
                    held += response.len() as u64;
                    accepted.push(key.clone());
                    responses.push((key, response));
                }
                None => ignored.push(key),
            }
        }
        if responses.is_empty() {
            return Ok(InputAnswered {
                task: t.meta,
                accepted,
                ignored,
            });
        }
        let slots: u64 = txn
            .task_slots(id)?
            .iter()
            .map(|s| {
                slot_bytes(
                    &s.key,
                    s.request.len(),
                    s.response.as_ref().map_or(0, Vec::len),
                )
            })
            .sum();
        let limit = u64::from(self.shared.config.tasks.input_bytes_max);
        if slots + held > limit {
            return Err(Error::TooLarge {
                what: "input requests and answers of the task (bytes)",
                got: slots + held,
                limit,
            });
        }
        self.emit(
            vec![Record::TaskInputAnswered(TaskInputAnswered {
                id,
                version: t.meta.version + 1,
                responses,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(InputAnswered {
            task: written(txn, id)?,
            accepted,
            ignored,
        })
    }

    fn cancel_task(
        &mut self,
        req: TaskCancel,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskCancelled> {
        let t = owned(txn, &req.task)?;
        let id = t.meta.id;
        if t.meta.status.is_terminal() {
            return Ok(TaskCancelled {
                task: t.meta,
                already_terminal: true,
            });
        }
        let version = t.meta.version + 1;
        let record = match req.mode {
            CancelMode::Request if t.meta.cancel_requested => {
                return Ok(TaskCancelled {
                    task: t.meta,
                    already_terminal: false,
                });
            }
            CancelMode::Request => Record::TaskCancelRequested(TaskCancelRequested {
                id,
                version,
                at_ms: now,
            }),
            CancelMode::Terminal => Record::TaskEnded(TaskEnded {
                id,
                version,
                status: TaskStatus::Cancelled,
                cause: EndCause::Client,
                status_message: req.status_message,
                outcome: crate::task::TaskOutcome::none(),
                at_ms: now,
            }),
        };
        self.emit(vec![record], txn, buf)?;
        if req.mode == CancelMode::Terminal {
            self.shared.task_leases.remove(id);
        }
        Ok(TaskCancelled {
            task: written(txn, id)?,
            already_terminal: false,
        })
    }

    fn finish_task(
        &mut self,
        req: TaskFinish,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskWritten> {
        if !req.status.is_terminal() {
            return Err(Error::invalid(
                "status",
                format!(
                    "a task ends completed, failed or cancelled, not {}",
                    req.status
                ),
            ));
        }
        let t = owned(txn, &req.task)?;
        let id = t.meta.id;
        if t.meta.status.is_terminal() {
            // A retry of the call that ended it (the same status, and the same outcome or
            // none) writes nothing; anything else lost the race to end it.
            let same_outcome = req.outcome.kind == crate::task::OutcomeKind::None
                || (req.outcome.kind == t.meta.outcome_kind
                    && req.outcome.json == txn.task_outcome(id)?);
            if t.meta.status == req.status && same_outcome {
                return Ok(TaskWritten {
                    task: t.meta,
                    duplicate: true,
                });
            }
            return Err(Error::TaskTerminated {
                task_id: req.task.task_id,
                status: t.meta.status,
            });
        }
        check_version(&t, &req.task, req.expected_version)?;
        self.emit(
            vec![Record::TaskEnded(TaskEnded {
                id,
                version: t.meta.version + 1,
                status: req.status,
                cause: EndCause::Client,
                status_message: req.status_message,
                outcome: req.outcome,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        self.shared.task_leases.remove(id);
        Ok(TaskWritten {
            task: written(txn, id)?,
            duplicate: false,
        })
    }

    fn delete_task(
        &mut self,
        req: &TaskRef,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<TaskWritten> {
        let t = owned(txn, req)?;
        let id = t.meta.id;
        self.emit(
            vec![Record::TaskDeleted(TaskDeleted {
                id,
                removal: TaskRemoval::Deleted,
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        self.shared.task_leases.remove(id);
        Ok(TaskWritten {
            task: written(txn, id)?,
            duplicate: false,
        })
    }
}

/// The owner's task, not deleted: every other case is [`Error::UnknownTask`] (another
/// owner's id included, so nobody learns that it exists).
pub(super) fn owned(txn: &Txn<'_>, task: &TaskRef) -> Result<StoredTask> {
    txn.owned_task(&task.owner, &task.task_id)
}

/// The owner's task, still running, at `expected_version` if one is given.
fn running(txn: &Txn<'_>, task: &TaskRef, expected_version: Option<u64>) -> Result<StoredTask> {
    let t = owned(txn, task)?;
    if t.meta.status.is_terminal() {
        return Err(Error::TaskTerminated {
            task_id: task.task_id.clone(),
            status: t.meta.status,
        });
    }
    check_version(&t, task, expected_version)?;
    Ok(t)
}

fn check_version(t: &StoredTask, task: &TaskRef, expected_version: Option<u64>) -> Result<()> {
    match expected_version {
        Some(v) if v != t.meta.version => Err(Error::TaskConflict {
            task_id: task.task_id.clone(),
            expected_version: v,
            version: t.meta.version,
        }),
        _ => Ok(()),
    }
}

/// The task as the record just emitted left it.
fn written(txn: &Txn<'_>, id: u64) -> Result<TaskMeta> {
    txn.stored_task(id)?
        .map(|t| t.meta)
        .ok_or_else(|| Error::Internal(format!("task {id} is not in the index after its write")))
}
