//! The task side of the facade (docs/TASKS-DESIGN.md): durable MCP tasks. Writes are
//! checked here (nothing is queued for a malformed one), planned by the writer against the
//! current state with the task's version as compare-and-set, and answered once durable (on
//! a cluster: once applied after commit). Reads answer from the index, with a verdict.

use crate::api::{
    CreatedTask, InputAnswered, NewTask, TaskCancel, TaskCancelled, TaskChange, TaskDequeue,
    TaskDequeued, TaskEnqueue, TaskEnqueued, TaskFinish, TaskInputAnswer, TaskInputRequest,
    TaskPage, TaskRef, TaskRoute, TaskRouted, TaskView, TaskWritten,
};
use crate::error::{Error, Result};
use crate::index::{owner_task_key, owner_tasks_prefix, TaskRead};
use crate::mailbox::{send_async, Command, Reply, TaskCommand, TaskReply};
use crate::task::OutcomeKind;
use crate::task_watch::TaskWatch;

use super::{unexpected, Engine};

/// Most tasks one list page holds.
pub const TASK_PAGE_MAX: u32 = 1000;
/// The page size of a list call that names none (the TS SDK's in-memory store's).
pub const TASK_PAGE_DEFAULT: u32 = 10;

impl Engine {
    /// Creates a task, durably, or returns the one `request_key` created before.
    ///
    /// # Errors
    /// Invalid fields; [`Error::TaskExists`] when the owner has the task id from another
    /// request; [`Error::AtCapacity`] at a task cap; write failures.
    pub fn create_task(&self, req: NewTask) -> Result<CreatedTask> {
        self.check_new_task(&req)?;
        created(self.task_write(TaskCommand::Create(req))?)
    }

    /// [`Engine::create_task`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::create_task`].
    pub async fn create_task_async(&self, req: NewTask) -> Result<CreatedTask> {
        self.check_new_task(&req)?;
        created(self.task_write_async(TaskCommand::Create(req)).await?)
    }

    /// Changes a running task's status (working ↔ input_required), message or timing.
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; [`Error::TaskTerminated`]; [`Error::TaskConflict`] when
    /// `expected_version` is not the task's; a terminal status (use [`Engine::finish_task`]).
    pub fn change_task(&self, req: TaskChange) -> Result<TaskWritten> {
        self.check_change(&req)?;
        written(self.task_write(TaskCommand::Change(req))?)
    }

    /// [`Engine::change_task`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::change_task`].
    pub async fn change_task_async(&self, req: TaskChange) -> Result<TaskWritten> {
        self.check_change(&req)?;
        written(self.task_write_async(TaskCommand::Change(req)).await?)
    }

    /// Records input requests of a running task and moves it to `input_required`.
    ///
    /// # Errors
    /// As [`Engine::change_task`]; a key the task used before; [`Error::TooLarge`] past
    /// `tasks.input_bytes_max`.
    pub fn request_task_input(&self, req: TaskInputRequest) -> Result<TaskWritten> {
        self.check_input_request(&req)?;
        written(self.task_write(TaskCommand::RequestInput(req))?)
    }

    /// [`Engine::request_task_input`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::request_task_input`].
    pub async fn request_task_input_async(&self, req: TaskInputRequest) -> Result<TaskWritten> {
        self.check_input_request(&req)?;
        written(
            self.task_write_async(TaskCommand::RequestInput(req))
                .await?,
        )
    }

    /// Records answers to outstanding input requests, each exactly once; the others are
    /// ignored and reported. The last answer moves the task back to `working`.
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; invalid keys; [`Error::TooLarge`].
    pub fn answer_task_input(&self, req: TaskInputAnswer) -> Result<InputAnswered> {
        self.check_input_answer(&req)?;
        answered(self.task_write(TaskCommand::Answer(req))?)
    }

    /// [`Engine::answer_task_input`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::answer_task_input`].
    pub async fn answer_task_input_async(&self, req: TaskInputAnswer) -> Result<InputAnswered> {
        self.check_input_answer(&req)?;
        answered(self.task_write_async(TaskCommand::Answer(req)).await?)
    }

    /// Cancels a task: records the request (the 2026 cooperative cancel) or ends it
    /// `cancelled` (the 2025 `tasks/cancel`). A task that ended is acknowledged unchanged.
    ///
    /// # Errors
    /// [`Error::UnknownTask`].
    pub fn cancel_task(&self, req: TaskCancel) -> Result<TaskCancelled> {
        self.check_task_ref(&req.task)?;
        self.check_message(req.status_message.as_deref())?;
        cancelled(self.task_write(TaskCommand::Cancel(req))?)
    }

    /// [`Engine::cancel_task`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::cancel_task`].
    pub async fn cancel_task_async(&self, req: TaskCancel) -> Result<TaskCancelled> {
        self.check_task_ref(&req.task)?;
        self.check_message(req.status_message.as_deref())?;
        cancelled(self.task_write_async(TaskCommand::Cancel(req)).await?)
    }

    /// Ends a task with its terminal status and outcome, in one record. A retry (the same
    /// status, and the same outcome or none) answers `duplicate` and writes nothing.
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; [`Error::TaskTerminated`] naming the status it ended in, when
    /// another call ended it first; [`Error::TaskConflict`]; [`Error::TooLarge`].
    pub fn finish_task(&self, req: TaskFinish) -> Result<TaskWritten> {
        self.check_finish(&req)?;
        written(self.task_write(TaskCommand::Finish(req))?)
    }

    /// [`Engine::finish_task`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::finish_task`].
    pub async fn finish_task_async(&self, req: TaskFinish) -> Result<TaskWritten> {
        self.check_finish(&req)?;
        written(self.task_write_async(TaskCommand::Finish(req)).await?)
    }

    /// Deletes a task's content now; its tombstone answers [`crate::TaskVerdict::Deleted`] until
    /// the metadata horizon.
    ///
    /// # Errors
    /// [`Error::UnknownTask`].
    pub fn delete_task(&self, task: TaskRef) -> Result<TaskWritten> {
        self.check_task_ref(&task)?;
        written(self.task_write(TaskCommand::Delete(task))?)
    }

    /// [`Engine::delete_task`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::delete_task`].
    pub async fn delete_task_async(&self, task: TaskRef) -> Result<TaskWritten> {
        self.check_task_ref(&task)?;
        written(self.task_write_async(TaskCommand::Delete(task)).await?)
    }

    /// Enqueues a message on one of a task's queues, FIFO (a retry with the same dedupe key
    /// is a no-op while the message is queued).
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; [`Error::TaskQueueFull`] at the enqueuer's `max_len` or the
    /// server's bounds; invalid fields.
    pub fn enqueue_task_message(&self, req: TaskEnqueue) -> Result<TaskEnqueued> {
        self.check_enqueue(&req)?;
        match self.task_write(TaskCommand::Enqueue(req))? {
            TaskReply::Enqueued(q) => Ok(q),
            other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
        }
    }

    /// [`Engine::enqueue_task_message`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::enqueue_task_message`].
    pub async fn enqueue_task_message_async(&self, req: TaskEnqueue) -> Result<TaskEnqueued> {
        self.check_enqueue(&req)?;
        match self.task_write_async(TaskCommand::Enqueue(req)).await? {
            TaskReply::Enqueued(q) => Ok(q),
            other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
        }
    }

    /// Takes the oldest messages of one of a task's queues without waiting (none: an empty
    /// answer, nothing written). A retry with the same token gets the same batch again.
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; invalid fields.
    pub fn dequeue_task_messages(&self, req: TaskDequeue) -> Result<TaskDequeued> {
        self.check_dequeue(&req)?;
        match self.task_write(TaskCommand::Dequeue(req))? {
            TaskReply::Dequeued(d) => Ok(d),
            other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
        }
    }

    /// [`Engine::dequeue_task_messages`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::dequeue_task_messages`].
    pub async fn dequeue_task_messages_async(&self, req: TaskDequeue) -> Result<TaskDequeued> {
        self.check_dequeue(&req)?;
        match self.task_write_async(TaskCommand::Dequeue(req)).await? {
            TaskReply::Dequeued(d) => Ok(d),
            other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
        }
    }

    /// Routes a client's answer to the task whose outbound request (enqueued with this
    /// `correlation`) it answers: appends it to that task's inbound queue and closes the route
    /// in the same record, so it is routed once, whichever replica the answer reached. A retry
    /// after an unknown outcome answers the same task and qseq as `duplicate`. Not routed
    /// (nothing written): no route of this owner has the correlation (never asked, another
    /// owner's, its task deleted), or its task has ended.
    ///
    /// # Errors
    /// [`Error::TaskQueueFull`] when the task's inbound queue is at the server's bounds;
    /// invalid fields.
    pub fn route_task_message(&self, req: TaskRoute) -> Result<TaskRouted> {
        self.check_route(&req)?;
        match self.task_write(TaskCommand::Route(req))? {
            TaskReply::Routed(r) => Ok(r),
            other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
        }
    }

    /// [`Engine::route_task_message`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::route_task_message`].
    pub async fn route_task_message_async(&self, req: TaskRoute) -> Result<TaskRouted> {
        self.check_route(&req)?;
        match self.task_write_async(TaskCommand::Route(req)).await? {
            TaskReply::Routed(r) => Ok(r),
            other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
        }
    }

    fn check_route(&self, req: &TaskRoute) -> Result<()> {
        self.check_owner(&req.owner)?;
        self.check_id("correlation", &req.correlation)?;
        self.check_queue_message(&req.message)
    }

    fn check_queue_message(&self, message: &[u8]) -> Result<()> {
        let limit = self.config().tasks.queue_bytes_max;
        if message.len() as u64 > u64::from(limit) {
            return Err(Error::TooLarge {
                what: "task queue message (bytes)",
                got: message.len() as u64,
                limit: u64::from(limit),
            });
        }
        Ok(())
    }

    fn check_channel(channel: u8) -> Result<()> {
        if channel > crate::task::INBOUND {
            return Err(Error::invalid(
                "channel",
                format!("is {channel}; 0 is the outbound queue, 1 the inbound one"),
            ));
        }
        Ok(())
    }

    fn check_enqueue(&self, req: &TaskEnqueue) -> Result<()> {
        self.check_task_ref(&req.task)?;
        Self::check_channel(req.channel)?;
        if let Some(d) = &req.dedupe_key {
            self.check_id("dedupe_key", d)?;
        }
        if let Some(c) = &req.correlation {
            self.check_id("correlation", c)?;
        }
        self.check_queue_message(&req.message)
    }

    fn check_dequeue(&self, req: &TaskDequeue) -> Result<()> {
        self.check_task_ref(&req.task)?;
        Self::check_channel(req.channel)?;
        self.check_id("token", &req.token)
    }

    /// Renews the worker lease of a running task (its worker's heartbeat): without one
    /// within `worker_lease_ms`, the leader fails the task. Changes and input requests renew
    /// it too. On a cluster, call it on the leader (leases are the leader's memory).
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; [`Error::TaskTerminated`].
    pub fn keep_task_alive(&self, task: &TaskRef) -> Result<()> {
        self.check_task_ref(task)?;
        let t = self
            .inner
            .shared
            .index
            .owned_task(&task.owner, &task.task_id)?;
        let id = t.meta.id;
        if t.meta.status.is_terminal() {
            return Err(Error::TaskTerminated {
                task_id: task.task_id.clone(),
                status: t.meta.status,
            });
        }
        crate::background::renew_task_lease(&self.inner.shared, id, t.meta.status);
        Ok(())
    }

    /// Runs one round of the task clocks now (the leader's TTL and worker-lease passes),
    /// for tests on a [`crate::ManualClock`] with `background_expiry` off; returns how many
    /// tasks it changed.
    ///
    /// # Errors
    /// Index failures of the TTL scan.
    pub fn run_task_expiry(&self) -> Result<usize> {
        let tx = self.sender()?;
        let shared = &self.inner.shared;
        let leases = crate::background::expire_task_leases(shared, &tx);
        Ok(leases + crate::background::expire_tasks(shared, &tx)?)
    }

    /// The task `task.task_id` of `task.owner`, as a verdict: found, expired, deleted or
    /// unknown (another owner's task is unknown). With `include_outcome`, a terminal task's
    /// result or error comes with it.
    ///
    /// # Errors
    /// Invalid ids; index failures.
    pub fn task(&self, task: &TaskRef, include_outcome: bool) -> Result<TaskView> {
        self.check_task_ref(task)?;
        crate::task_watch::view(&self.inner.shared, task, include_outcome)
    }

    /// A live watch of `task`: it yields the task whenever its version moves past
    /// `after_version` (0: at once), until it delivered the task's end. A watch pins nothing:
    /// it costs a bell until dropped.
    ///
    /// # Errors
    /// [`Error::UnknownTask`]; [`Error::Closed`] after close.
    pub fn watch_task(&self, task: &TaskRef, after_version: u64) -> Result<TaskWatch> {
        self.check_task_ref(task)?;
        TaskWatch::new(
            std::sync::Arc::clone(&self.inner.shared),
            task,
            after_version,
        )
    }

    /// One page of `owner`'s tasks (not deleted), in creation order, after the task whose
    /// engine id is `after` (`None`: from the first). `page_size` 0 means
    /// [`TASK_PAGE_DEFAULT`]; at most [`TASK_PAGE_MAX`].
    ///
    /// # Errors
    /// Invalid owner or page size; index failures.
    pub fn list_tasks(&self, owner: &str, after: Option<u64>, page_size: u32) -> Result<TaskPage> {
        self.check_owner(owner)?;
        if page_size > TASK_PAGE_MAX {
            return Err(Error::invalid(
                "page_size",
                format!("is {page_size}; the limit is {TASK_PAGE_MAX}"),
            ));
        }
        let size = if page_size == 0 {
            TASK_PAGE_DEFAULT
        } else {
            page_size
        } as usize;
        let index = &self.inner.shared.index;
        let prefix = owner_tasks_prefix(owner);
        let start = match after {
            Some(id) => owner_task_key(owner, id.saturating_add(1)),
            None => prefix.clone(),
        };
        let end = crate::index::owner_tasks_prefix_end(owner);
        let keys = index.keys_in(&start, &end, size + 1)?;
        let mut tasks = Vec::with_capacity(size);
        let mut next = None;
        for key in keys {
            let Some(id) = key
                .get(prefix.len()..)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
            else {
                continue;
            };
            if tasks.len() == size {
                next = tasks.last().map(|t: &crate::task::TaskMeta| t.id);
                break;
            }
            if let Some(t) = index.stored_task(id)? {
                tasks.push(t.meta);
            }
        }
        Ok(TaskPage { tasks, next })
    }

    fn task_write(&self, cmd: TaskCommand) -> Result<TaskReply> {
        match self.submit(Command::Task(cmd))? {
            Reply::Task(r) => Ok(*r),
            other => Err(unexpected(&other)),
        }
    }

    async fn task_write_async(&self, cmd: TaskCommand) -> Result<TaskReply> {
        let tx = self.sender()?;
        let answer = send_async(&tx, &self.inner.shared, Command::Task(cmd)).await?;
        match answer.await.map_err(|_| Error::Closed)?? {
            Reply::Task(r) => Ok(*r),
            other => Err(unexpected(&other)),
        }
    }

    fn check_owner(&self, owner: &str) -> Result<()> {
        let max = self.config().id_bytes_max;
        if owner.len() > max as usize {
            return Err(Error::invalid(
                "owner",
                format!("is {} bytes; the limit is {max}", owner.len()),
            ));
        }
        Ok(())
    }

    fn check_task_ref(&self, task: &TaskRef) -> Result<()> {
        self.check_owner(&task.owner)?;
        self.check_id("task_id", &task.task_id)
    }

    fn check_message(&self, message: Option<&str>) -> Result<()> {
        let limit = self.config().tasks.status_message_bytes_max;
        match message {
            Some(m) if m.len() as u64 > u64::from(limit) => Err(Error::TooLarge {
                what: "task status message (bytes)",
                got: m.len() as u64,
                limit: u64::from(limit),
            }),
            _ => Ok(()),
        }
    }

    fn check_ttl(ttl_ms: Option<u64>) -> Result<()> {
        if ttl_ms == Some(0) {
            return Err(Error::invalid(
                "ttl_ms",
                "must be at least 1 ms (leave it out for the default)",
            ));
        }
        Ok(())
    }

    fn check_new_task(&self, req: &NewTask) -> Result<()> {
        self.check_task_ref(&TaskRef::new(req.owner.clone(), req.task_id.clone()))?;
        self.check_id("request_key", &req.request_key)?;
        self.check_message(req.status_message.as_deref())?;
        Self::check_ttl(req.ttl_ms)?;
        if req.worker_lease_ms == Some(0) {
            return Err(Error::invalid("worker_lease_ms", "must be at least 1 ms"));
        }
        let limit = self.config().tasks.context_bytes_max;
        if req.context.len() as u64 > u64::from(limit) {
            return Err(Error::TooLarge {
                what: "task context (bytes)",
                got: req.context.len() as u64,
                limit: u64::from(limit),
            });
        }
        Ok(())
    }

    fn check_change(&self, req: &TaskChange) -> Result<()> {
        self.check_task_ref(&req.task)?;
        self.check_message(req.status_message.as_deref())?;
        Self::check_ttl(req.ttl_ms)
    }

    fn check_pairs(&self, field: &'static str, pairs: &[(String, Vec<u8>)]) -> Result<()> {
        if pairs.is_empty() {
            return Err(Error::invalid(field, "must hold at least one key"));
        }
        let limit = self.config().payload_bytes_max;
        for (key, body) in pairs {
            self.check_id(field, key)?;
            if body.len() as u64 > u64::from(limit) {
                return Err(Error::TooLarge {
                    what: "task input request or answer (bytes)",
                    got: body.len() as u64,
                    limit: u64::from(limit),
                });
            }
        }
        Ok(())
    }

    fn check_input_request(&self, req: &TaskInputRequest) -> Result<()> {
        self.check_task_ref(&req.task)?;
        self.check_message(req.status_message.as_deref())?;
        self.check_pairs("requests", &req.requests)
    }

    fn check_input_answer(&self, req: &TaskInputAnswer) -> Result<()> {
        self.check_task_ref(&req.task)?;
        self.check_pairs("responses", &req.responses)
    }

    fn check_finish(&self, req: &TaskFinish) -> Result<()> {
        self.check_task_ref(&req.task)?;
        self.check_message(req.status_message.as_deref())?;
        if (req.outcome.kind == OutcomeKind::None) != req.outcome.json.is_empty() {
            return Err(Error::invalid(
                "outcome",
                "a result or error needs its JSON, and no outcome has none",
            ));
        }
        let limit = self.config().tasks.outcome_bytes_max;
        if req.outcome.json.len() as u64 > u64::from(limit) {
            return Err(Error::TooLarge {
                what: "task outcome (bytes)",
                got: req.outcome.json.len() as u64,
                limit: u64::from(limit),
            });
        }
        Ok(())
    }
}

fn created(reply: TaskReply) -> Result<CreatedTask> {
    match reply {
        TaskReply::Created(c) => Ok(c),
        other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
    }
}

fn written(reply: TaskReply) -> Result<TaskWritten> {
    match reply {
        TaskReply::Written(w) => Ok(w),
        other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
    }
}

fn answered(reply: TaskReply) -> Result<InputAnswered> {
    match reply {
        TaskReply::Answered(a) => Ok(a),
        other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
    }
}

fn cancelled(reply: TaskReply) -> Result<TaskCancelled> {
    match reply {
        TaskReply::Cancelled(c) => Ok(c),
        other => Err(Error::Internal(format!("unexpected task reply {other:?}"))),
    }
}
