//! Request and response values of the task API (docs/TASKS-DESIGN.md §3). Every call names
//! the task by its owner and the caller's task id: another owner's task id is simply not
//! found, never "forbidden".

use crate::task::{InputSlot, TaskMeta, TaskOutcome, TaskStatus};

/// Creates a task (MCP `CreateTaskResult` may be answered once this returns: the task is
/// durable, on a cluster committed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// The owner (a session or an authorization context); may be empty (a shared
    /// namespace), at most `id_bytes_max` bytes.
    pub owner: String,
    /// The caller's task id, unique per owner; 1..=`id_bytes_max` bytes.
    pub task_id: String,
    /// The create request's idempotency key: a retry with the same key gets the first
    /// task back, whatever task id it names. 1..=`id_bytes_max` bytes.
    pub request_key: String,
    /// How long the task lives (`None`: `tasks.ttl_default`; clamped to `tasks.ttl_max`).
    pub ttl_ms: Option<u64>,
    /// How often clients should poll (`None`: `tasks.poll_interval_default`).
    pub poll_interval_ms: Option<u64>,
    /// The worker's lease: without a renewal within it, the task fails (`None`: no lease).
    pub worker_lease_ms: Option<u64>,
    /// A first status message.
    pub status_message: Option<String>,
    /// Opaque context kept with the task (the request that created it, a tool name).
    pub context: Vec<u8>,
}

/// What a create did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedTask {
    /// The task (the first one, for a retry).
    pub task: TaskMeta,
    /// False when the request key had created it before (nothing was written).
    pub created: bool,
}

/// Names one task of one owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRef {
    /// Its owner.
    pub owner: String,
    /// The caller's task id.
    pub task_id: String,
}

impl TaskRef {
    /// The task `task_id` of `owner`.
    pub fn new(owner: impl Into<String>, task_id: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            task_id: task_id.into(),
        }
    }
}

/// Changes a running task's status (working ↔ input_required), message or timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskChange {
    /// The task.
    pub task: TaskRef,
    /// Compare-and-set: refused with [`crate::Error::TaskConflict`] unless the task is at
    /// this version.
    pub expected_version: Option<u64>,
    /// The new status: `Working` or `InputRequired` (a terminal one goes through
    /// [`TaskFinish`], with its outcome).
    pub status: TaskStatus,
    /// A new status message (`None` keeps the last one).
    pub status_message: Option<String>,
    /// A new TTL (`None` keeps it).
    pub ttl_ms: Option<u64>,
    /// A new poll interval (`None` keeps it).
    pub poll_interval_ms: Option<u64>,
}

/// Ends a task with its terminal status and outcome, in one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFinish {
    /// The task.
    pub task: TaskRef,
    /// Compare-and-set, as in [`TaskChange`].
    pub expected_version: Option<u64>,
    /// `Completed`, `Failed` or `Cancelled`.
    pub status: TaskStatus,
    /// A last status message (`None` keeps the last one).
    pub status_message: Option<String>,
    /// The result or error (at most `tasks.outcome_bytes_max` bytes).
    pub outcome: TaskOutcome,
}

/// A write's answer: the task after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskWritten {
    /// The task as it is now.
    pub task: TaskMeta,
    /// Nothing was written: the call restated what the task already is (a retry).
    pub duplicate: bool,
}

/// A task asks its client for input (SEP-2663 `inputRequests`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInputRequest {
    /// The task.
    pub task: TaskRef,
    /// (key, request JSON): each key used once in the task's life.
    pub requests: Vec<(String, Vec<u8>)>,
    /// A new status message (`None` keeps the last one).
    pub status_message: Option<String>,
}

/// The client answers input requests (SEP-2663 `tasks/update`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInputAnswer {
    /// The task.
    pub task: TaskRef,
    /// (key, response JSON).
    pub responses: Vec<(String, Vec<u8>)>,
}

/// What an answer did: keys that were not outstanding (unknown, answered before, dropped,
/// or the task ended) are ignored and reported, not refused, so a retry is harmless.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputAnswered {
    /// The task as it is now.
    pub task: TaskMeta,
    /// Keys whose answer was recorded.
    pub accepted: Vec<String>,
    /// Keys ignored.
    pub ignored: Vec<String>,
}

/// How a cancel acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelMode {
    /// The 2026 cooperative cancel: records the request; the worker ends the task.
    Request,
    /// The 2025 `tasks/cancel`: the task ends `cancelled` now.
    Terminal,
}

/// Cancels a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCancel {
    /// The task.
    pub task: TaskRef,
    /// How.
    pub mode: CancelMode,
    /// A status message for a terminal cancel.
    pub status_message: Option<String>,
}

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCancelled {
    /// The task as it is now.
    pub task: TaskMeta,
    /// The task had ended before: nothing changed (the protocol acknowledges it anyway).
    pub already_terminal: bool,
}

/// What a lookup found: a verdict, as data (like a cursor's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskVerdict {
    /// The task exists.
    Found,
    /// Its content was deleted when its TTL ran out after it ended; only its tombstone is
    /// left (a late `tasks/get` hears "expired", not "unknown").
    Expired,
    /// Its content was deleted on request.
    Deleted,
    /// No such task of this owner (never created, another owner's, or forgotten past the
    /// metadata horizon).
    Unknown,
}

/// A task as a lookup sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskView {
    /// The verdict.
    pub verdict: TaskVerdict,
    /// The task (its tombstone for `Expired`/`Deleted`; `None` for `Unknown`).
    pub task: Option<TaskMeta>,
    /// Its outcome, once terminal (with `include_outcome`).
    pub outcome: Option<TaskOutcome>,
    /// Its input requests still waiting for an answer.
    pub outstanding: Vec<InputSlot>,
    /// Its input requests that were answered, with their answers (the running replica reads
    /// an answer another replica took from here).
    pub answered: Vec<InputSlot>,
    /// Messages waiting in its outbound queue (to the client).
    pub outbound_queued: u64,
    /// Messages waiting in its inbound queue (the client's answers).
    pub inbound_queued: u64,
}

/// One page of an owner's tasks, in creation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPage {
    /// The tasks (not deleted).
    pub tasks: Vec<TaskMeta>,
    /// Where the next page starts (`None`: this is the last).
    pub next: Option<u64>,
}

/// Enqueues a message on one of a task's queues (the 2025 `TaskMessageQueue.enqueue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnqueue {
    /// The task.
    pub task: TaskRef,
    /// [`crate::OUTBOUND`] (to the client) or [`crate::INBOUND`] (the client's answers).
    pub channel: u8,
    /// The message (JSON bytes).
    pub message: Vec<u8>,
    /// The enqueuer's bound on the queue's length (the SDK's `maxSize`; 0: the server's
    /// `tasks.queue_len_max`).
    pub max_len: u32,
    /// An idempotency key: a retry with it is a no-op while the message is queued.
    pub dedupe_key: Option<String>,
    /// The JSON-RPC id of a request the message carries.
    pub correlation: Option<String>,
}

/// What an enqueue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnqueued {
    /// The message's place in its queue.
    pub qseq: u64,
    /// The dedupe key had queued it before: nothing was written.
    pub duplicate: bool,
}

/// Dequeues messages from one of a task's queues, FIFO, without waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDequeue {
    /// The task.
    pub task: TaskRef,
    /// Which queue.
    pub channel: u8,
    /// Most messages to take (0: all).
    pub max_messages: u32,
    /// The caller's token for this dequeue: a retry with the same token (after an unknown
    /// outcome) gets the same messages again, so none is lost or delivered twice.
    pub token: String,
}

/// What a dequeue took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDequeued {
    /// The messages, in FIFO order (empty: the queue was empty; nothing was written).
    pub messages: Vec<crate::task::QueuedMessage>,
    /// A retry of the last dequeue: these are its messages again.
    pub duplicate: bool,
}

/// Routes a client's answer to the task whose outbound request it answers, whichever replica
/// received it (docs/TASKS-DESIGN.md §1.6, inbound channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRoute {
    /// The owner the request was enqueued under.
    pub owner: String,
    /// The JSON-RPC id of the request being answered, as its outbound enqueue gave it.
    pub correlation: String,
    /// The client's answer (JSON bytes, never parsed).
    pub message: Vec<u8>,
}

/// What a routing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRouted {
    /// False: no route leads anywhere for (owner, correlation) — never asked, its task ended
    /// before the answer came, or was deleted; nothing was written.
    pub routed: bool,
    /// The task the answer went to (empty when not routed).
    pub task_id: String,
    /// The answer's place in the task's inbound queue (0 when not routed).
    pub qseq: u64,
    /// The answer had been routed before (a retry): nothing new was written.
    pub duplicate: bool,
}
