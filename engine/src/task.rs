//! Durable MCP tasks (issue 20, docs/TASKS-DESIGN.md): the task state machine as plain
//! values. A task is an entity of its own, not a stream: its id is the LSN of its
//! `TaskCreated` record, it belongs to one owner, and its status moves only as the MCP tasks
//! protocol allows ([`may_move`]), one version at a time.
//!
//! Pure: no storage, no clock. The planner and the apply rules both decide with these.

/// A task's lifecycle. `Completed`, `Failed` and `Cancelled` are terminal and never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// The task is running.
    Working,
    /// The task waits for input from the client (SEP-2663 `tasks/update`, or an
    /// elicitation through the 2025 message queue).
    InputRequired,
    /// The task finished with a result.
    Completed,
    /// The task failed (its own error, its TTL, its worker's lease, or fencing).
    Failed,
    /// The task was cancelled.
    Cancelled,
}

impl TaskStatus {
    /// Every status, in code order.
    pub const ALL: [Self; 5] = [
        Self::Working,
        Self::InputRequired,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// True for `Completed`, `Failed` and `Cancelled`.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The MCP wire name (`working`, `input_required`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The status's code on disk (FORMAT.md, "Task records").
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Working => 0,
            Self::InputRequired => 1,
            Self::Completed => 2,
            Self::Failed => 3,
            Self::Cancelled => 4,
        }
    }

    /// The status of a code on disk, if it is one.
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a task may move from `from` to `to`: `working` ↔ `input_required`, either of them
/// to a terminal status, and a non-terminal status to itself (a message or timing update).
/// Nothing leaves a terminal status. The single definition: the planner and the apply rules
/// both call it.
pub fn may_move(from: TaskStatus, to: TaskStatus) -> bool {
    use TaskStatus::{Cancelled, Completed, Failed, InputRequired, Working};
    match (from, to) {
        (Completed | Failed | Cancelled, _) => false,
        (Working | InputRequired, Working | InputRequired | Completed | Failed | Cancelled) => true,
    }
}

/// Why a task reached its terminal status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndCause {
    /// Its worker or a client ended it (a result, an error, a cancel).
    Client,
    /// Its TTL elapsed while it was still running.
    TtlExpired,
    /// Its worker's lease expired: the replica running it died or stopped renewing.
    LeaseExpired,
    /// Recovery fenced writes that may have been lost, and the task with them.
    Fenced,
}

impl EndCause {
    /// Stable lowercase name, for logs and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::TtlExpired => "ttl expired",
            Self::LeaseExpired => "lease expired",
            Self::Fenced => "fenced",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Client => 0,
            Self::TtlExpired => 1,
            Self::LeaseExpired => 2,
            Self::Fenced => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        [
            Self::Client,
            Self::TtlExpired,
            Self::LeaseExpired,
            Self::Fenced,
        ]
        .get(usize::from(code))
        .copied()
    }
}

/// What a terminal task's outcome holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// No outcome (a cancel, or an end by TTL without a stored error).
    None,
    /// The request's result (an MCP `CallToolResult`, `isError` results included), as JSON.
    Result,
    /// A JSON-RPC error object.
    Error,
}

impl OutcomeKind {
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Result => 1,
            Self::Error => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        [Self::None, Self::Result, Self::Error]
            .get(usize::from(code))
            .copied()
    }
}

/// A terminal task's result or error, stored with its terminal status in one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutcome {
    /// What `json` is.
    pub kind: OutcomeKind,
    /// The result or error as JSON bytes (empty for [`OutcomeKind::None`]).
    pub json: Vec<u8>,
}

impl TaskOutcome {
    /// No outcome.
    pub fn none() -> Self {
        Self {
            kind: OutcomeKind::None,
            json: Vec::new(),
        }
    }
}

/// Why a task's content was deleted (its tombstone stays until the metadata horizon).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskRemoval {
    /// A TTL after it ended: a late `tasks/get` hears "expired".
    Expired,
    /// Deleted on request (Python's `delete_task`).
    Deleted,
}

impl TaskRemoval {
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Expired => 0,
            Self::Deleted => 1,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        [Self::Expired, Self::Deleted]
            .get(usize::from(code))
            .copied()
    }
}

/// What the engine remembers about a task.
///
/// # Invariants
/// `version` starts at 1 and grows by one per accepted change of status, message, timing,
/// inputs or cancel request; a terminal `status` never changes; `updated_at_ms` never goes
/// backwards; `ended_at_ms` and `end_cause` are set exactly when `status` is terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMeta {
    /// Engine id: the LSN of the `TaskCreated` record.
    pub id: u64,
    /// The owner (a session or an authorization context, formed by the adapter). Only this
    /// owner sees the task.
    pub owner: String,
    /// The caller's task id (the MCP `taskId`), unique per owner.
    pub task_id: String,
    /// The create request's idempotency key, unique per owner.
    pub request_key: String,
    /// Lifecycle status.
    pub status: TaskStatus,
    /// The last status message, if any.
    pub status_message: Option<String>,
    /// 1 at creation, +1 per accepted change.
    pub version: u64,
    /// When the task was created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// When it last changed.
    pub updated_at_ms: u64,
    /// How long it lives: while running, from creation; once ended, from its end.
    pub ttl_ms: Option<u64>,
    /// How often clients should poll it.
    pub poll_interval_ms: u64,
    /// Its worker's lease: without a renewal within it, the task fails.
    pub worker_lease_ms: Option<u64>,
    /// A client asked to cancel it (the 2026 cooperative cancel).
    pub cancel_requested: bool,
    /// When it reached its terminal status.
    pub ended_at_ms: Option<u64>,
    /// Why it did.
    pub end_cause: Option<EndCause>,
    /// When its content was deleted: it is a tombstone from then on.
    pub deleted_at_ms: Option<u64>,
    /// Why it was.
    pub removal: Option<TaskRemoval>,
    /// What its outcome holds (the bytes are kept beside it).
    pub outcome_kind: OutcomeKind,
    /// Opaque caller context (the request that created it, a tool name), at most 64 KiB.
    pub context: Vec<u8>,
}

impl TaskMeta {
    /// True once its content is deleted and only its tombstone is left.
    pub fn is_deleted(&self) -> bool {
        self.deleted_at_ms.is_some()
    }

    /// The time its TTL runs out, if it has one: from creation while it runs, from its end
    /// once ended (the timer restarts when the task finishes).
    pub fn deadline_ms(&self) -> Option<u64> {
        let ttl = self.ttl_ms?;
        Some(
            self.ended_at_ms
                .unwrap_or(self.created_at_ms)
                .saturating_add(ttl),
        )
    }
}

/// Where an input request of a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotState {
    /// Asked, not answered.
    Outstanding,
    /// Answered (the response is kept).
    Answered,
    /// Dropped unanswered by a cancel request or the task's end; its key stays used.
    Dropped,
}

impl SlotState {
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Outstanding => 0,
            Self::Answered => 1,
            Self::Dropped => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        [Self::Outstanding, Self::Answered, Self::Dropped]
            .get(usize::from(code))
            .copied()
    }
}

/// One input request of a task and its answer (SEP-2663 `inputRequests`/`inputResponses`).
/// Its key is used once in the task's lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSlot {
    /// The request's key.
    pub key: String,
    /// The request (JSON bytes).
    pub request: Vec<u8>,
    /// The answer, once given.
    pub response: Option<Vec<u8>>,
    /// Where it stands.
    pub state: SlotState,
}

/// The queue of a task's messages to its client (the 2025 `TaskMessageQueue`).
pub const OUTBOUND: u8 = 0;
/// The queue of the client's answers to the replica running the task.
pub const INBOUND: u8 = 1;

/// A message in one of a task's queues, FIFO by `qseq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedMessage {
    /// Its place in its queue: 1, 2, ... in enqueue order.
    pub qseq: u64,
    /// When it was enqueued.
    pub at_ms: u64,
    /// The enqueuer's idempotency key: a retried enqueue with it is a no-op while the
    /// message is queued.
    pub dedupe_key: Option<String>,
    /// The JSON-RPC id of a request it carries, if any.
    pub correlation: Option<String>,
    /// The message (JSON bytes).
    pub message: Vec<u8>,
}

/// Where one of a task's queues stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueueState {
    /// The last dequeued qseq (0 before the first dequeue).
    pub head: u64,
    /// The last enqueued qseq.
    pub tail: u64,
    /// Bytes of the messages queued.
    pub bytes: u64,
    /// The token of the last dequeue (its batch is kept for a retry with it).
    pub last_token: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole table of moves, written out independently of `may_move`'s body.
    #[test]
    fn may_move_follows_the_protocol_table() {
        use TaskStatus::*;
        let allowed = [
            (Working, Working),
            (Working, InputRequired),
            (Working, Completed),
            (Working, Failed),
            (Working, Cancelled),
            (InputRequired, InputRequired),
            (InputRequired, Working),
            (InputRequired, Completed),
            (InputRequired, Failed),
            (InputRequired, Cancelled),
        ];
        for from in TaskStatus::ALL {
            for to in TaskStatus::ALL {
                assert_eq!(
                    may_move(from, to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn terminal_statuses_are_exactly_the_three_ends() {
        let terminal: Vec<_> = TaskStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                TaskStatus::Completed,
                TaskStatus::Failed,
                TaskStatus::Cancelled
            ]
        );
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_refused() {
        for s in TaskStatus::ALL {
            assert_eq!(TaskStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(TaskStatus::from_code(5), None);
        for c in [
            EndCause::Client,
            EndCause::TtlExpired,
            EndCause::LeaseExpired,
            EndCause::Fenced,
        ] {
            assert_eq!(EndCause::from_code(c.code()), Some(c));
        }
        assert_eq!(EndCause::from_code(4), None);
        for k in [OutcomeKind::None, OutcomeKind::Result, OutcomeKind::Error] {
            assert_eq!(OutcomeKind::from_code(k.code()), Some(k));
        }
        assert_eq!(OutcomeKind::from_code(3), None);
        for r in [TaskRemoval::Expired, TaskRemoval::Deleted] {
            assert_eq!(TaskRemoval::from_code(r.code()), Some(r));
        }
        assert_eq!(TaskRemoval::from_code(2), None);
        for s in [
            SlotState::Outstanding,
            SlotState::Answered,
            SlotState::Dropped,
        ] {
            assert_eq!(SlotState::from_code(s.code()), Some(s));
        }
        assert_eq!(SlotState::from_code(3), None);
    }

    #[test]
    fn the_deadline_restarts_when_the_task_ends() {
        let mut m = TaskMeta {
            id: 9,
            owner: "s:a".into(),
            task_id: "t".into(),
            request_key: "1".into(),
            status: TaskStatus::Working,
            status_message: None,
            version: 1,
            created_at_ms: 1_000,
            updated_at_ms: 1_000,
            ttl_ms: Some(500),
            poll_interval_ms: 1_000,
            worker_lease_ms: None,
            cancel_requested: false,
            ended_at_ms: None,
            end_cause: None,
            deleted_at_ms: None,
            removal: None,
            outcome_kind: OutcomeKind::None,
            context: Vec::new(),
        };
        assert_eq!(m.deadline_ms(), Some(1_500));
        m.ended_at_ms = Some(1_200);
        assert_eq!(m.deadline_ms(), Some(1_700));
        m.ttl_ms = None;
        assert_eq!(m.deadline_ms(), None);
    }
}
