//! The writer's mailbox: the requests it takes and the answers it gives. Sending goes
//! through [`crate::admission`]: a request waits before entering the queue while the
//! requests queued and in the writer's current group hold more than
//! `writer_queue_bytes_max` (one request is always admitted into an empty queue, whatever
//! its size).

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, SyncSender};

use crate::api::{
    Append, Appended, CreatedTask, EpochAdvanced, InputAnswered, NewEvent, NewTask, OpenStream,
    SessionExpired, SessionInfo, StreamInfo, TaskCancel, TaskCancelled, TaskChange, TaskDequeue,
    TaskDequeued, TaskEnqueue, TaskEnqueued, TaskFinish, TaskInputAnswer, TaskInputRequest,
    TaskRef, TaskRoute, TaskRouted, TaskWritten, Terminated,
};
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::state::StreamState;

/// A request to the writer.
#[derive(Debug)]
pub(crate) enum Command {
    OpenSession {
        session: String,
        /// Stored with a session this creates (ignored for an existing one).
        state: Option<Vec<u8>>,
    },
    SetSessionState {
        session: String,
        state: Vec<u8>,
    },
    AdvanceEpoch(String),
    /// Expire a session (explicitly, or after its idle TTL: `idle_ms` says how long it was
    /// idle, for the tombstones' reason).
    ExpireSession {
        session: String,
        idle_ms: Option<u64>,
    },
    OpenStream(OpenStream),
    Append(Append),
    Terminate {
        session: Option<String>,
        stream: u64,
        state: StreamState,
        expected_next_seq: Option<u64>,
        reason: Option<String>,
        frame: Option<NewEvent>,
    },
    Trim {
        session: Option<String>,
        stream: u64,
        watermark: u64,
    },
    /// Carry forward (snapshot, or forget past the horizon) at most `limit` of the states
    /// born below `below_lsn`, in one group. Answers how many are left.
    CarryForward {
        below_lsn: u64,
        limit: usize,
    },
    /// Forget at most `limit` sessions and streams that ended more than the metadata
    /// horizon ago, in one group. Answers how many were forgotten.
    Forget {
        limit: usize,
    },
    /// Retire the segments `bases` (the oldest), once nothing born below `below_lsn` is left
    /// to carry forward; drops the run starts of `streams` that point into them.
    Retire {
        below_lsn: u64,
        bases: Vec<u64>,
        streams: Vec<u64>,
    },
    /// A durable MCP task's write.
    Task(TaskCommand),
    Sync,
}

/// The task writes (docs/TASKS-DESIGN.md §3), planned in `writer/plan/task.rs`.
#[derive(Debug)]
pub(crate) enum TaskCommand {
    Create(NewTask),
    Change(TaskChange),
    RequestInput(TaskInputRequest),
    Answer(TaskInputAnswer),
    Cancel(TaskCancel),
    Finish(TaskFinish),
    Delete(TaskRef),
    Enqueue(TaskEnqueue),
    Dequeue(TaskDequeue),
    /// Routes a client's answer to the task that asked (the inbound channel).
    Route(TaskRoute),
    /// The leader's TTL pass: fail the task `id` if it still runs past its deadline, or
    /// delete its content if it ended a TTL ago.
    Expire(u64),
    /// The leader's lease pass: fail the task `id`, whose worker stopped renewing its lease.
    LeaseExpired(u64),
    /// Recovery's fencing (`lost.rs`, or a crash under a non-durable sync policy): fail the
    /// task `id`, still running, at a version past `past_version` (the last one a client may
    /// have seen), saying `why` in its status message and error.
    Fence {
        id: u64,
        past_version: u64,
        why: &'static str,
    },
    /// Recovery's lost-write fencing: write blank records (at most `max` in one group) until
    /// the log's last LSN reaches `through_lsn`, so no task is created with the id of a task
    /// whose creation was lost. Answers `Expired(true)` once the log is there.
    PadLsns {
        through_lsn: u64,
        max: usize,
    },
}

impl TaskCommand {
    /// The bytes it carries (for the writer queue's admission).
    fn bytes(&self) -> u64 {
        let pairs = |v: &[(String, Vec<u8>)]| -> u64 {
            v.iter().map(|(k, b)| (k.len() + b.len()) as u64).sum()
        };
        match self {
            Self::Create(t) => t.context.len() as u64,
            Self::RequestInput(r) => pairs(&r.requests),
            Self::Answer(a) => pairs(&a.responses),
            Self::Finish(f) => f.outcome.json.len() as u64,
            Self::Enqueue(q) => q.message.len() as u64,
            Self::Route(r) => (r.correlation.len() + r.message.len()) as u64,
            Self::Dequeue(_) => 0,
            Self::Change(_)
            | Self::Cancel(_)
            | Self::Delete(_)
            | Self::Expire(_)
            | Self::LeaseExpired(_)
            | Self::Fence { .. }
            | Self::PadLsns { .. } => 0,
        }
    }
}

/// The writer's answer to a [`TaskCommand`].
#[derive(Debug)]
pub(crate) enum TaskReply {
    Created(CreatedTask),
    Written(TaskWritten),
    Answered(InputAnswered),
    Cancelled(TaskCancelled),
    Enqueued(TaskEnqueued),
    Dequeued(TaskDequeued),
    Routed(TaskRouted),
    /// What an expiry pass did to one task (`false`: nothing was due).
    Expired(bool),
}

impl Command {
    /// What the request costs the queue, in bytes (an estimate of its memory).
    pub(crate) fn admission_bytes(&self) -> u64 {
        const BASE: u64 = 256;
        match self {
            Self::Append(a) => {
                BASE + a
                    .events
                    .iter()
                    .map(|e| {
                        64 + e.payload.len() as u64
                            + e.kind.len() as u64
                            + e.correlation.as_ref().map_or(0, |c| c.len() as u64)
                    })
                    .sum::<u64>()
            }
            Self::Terminate { frame: Some(f), .. } => BASE + f.payload.len() as u64,
            Self::OpenSession { state: Some(s), .. } => BASE + s.len() as u64,
            Self::SetSessionState { state, .. } => BASE + state.len() as u64,
            Self::Task(t) => BASE + t.bytes(),
            _ => BASE,
        }
    }
}

/// The writer's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Session(SessionInfo),
    Epoch(EpochAdvanced),
    Expired(SessionExpired),
    Stream(StreamInfo),
    Appended(Appended),
    Terminated(Terminated),
    Watermark(u64),
    /// How many items a carry-forward or forget pass left or did.
    Count(usize),
    Task(Box<TaskReply>),
    Done,
}

/// Where the writer sends a request's answer: a blocked thread, or an awaiting task.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    Blocking(SyncSender<Result<Reply>>),
    Async(tokio::sync::oneshot::Sender<Result<Reply>>),
}

impl ReplyTo {
    /// Delivers the answer; a caller that has gone away is no error (the request was
    /// carried out either way).
    pub(crate) fn send(self, reply: Result<Reply>) {
        match self {
            Self::Blocking(tx) => {
                let _ = tx.send(reply);
            }
            Self::Async(tx) => {
                let _ = tx.send(reply);
            }
        }
    }
}

/// A queued request: the command, where to answer, and the bytes it holds of the budget.
#[derive(Debug)]
pub(crate) struct Request {
    pub cmd: Command,
    pub reply: ReplyTo,
    pub bytes: u64,
}

/// The sending side of the mailbox.
pub(crate) type Mailbox = Sender<Request>;
/// The writer's side.
pub(crate) type Inbox = Receiver<Request>;

fn check_open(shared: &Shared) -> Result<()> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    Ok(())
}

/// Queues `cmd` (waiting, blocking, for admission); [`wait`] for the answer. Split from
/// [`submit`] so a caller can stop holding the mailbox while it waits.
pub(crate) fn send(tx: &Mailbox, shared: &Shared, cmd: Command) -> Result<Receiver<Result<Reply>>> {
    check_open(shared)?;
    let bytes = cmd.admission_bytes();
    shared.admission.take_blocking(bytes);
    let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
    let request = Request {
        cmd,
        reply: ReplyTo::Blocking(reply_tx),
        bytes,
    };
    if tx.send(request).is_err() {
        shared.admission.give_back(bytes);
        return Err(Error::Closed);
    }
    Ok(reply_rx)
}

/// Waits for the answer to a request queued with [`send`].
pub(crate) fn wait(reply: &Receiver<Result<Reply>>) -> Result<Reply> {
    reply.recv().map_err(|_| Error::Closed)?
}

/// Sends `cmd` to the writer and waits for its answer.
pub(crate) fn submit(tx: &Mailbox, shared: &Shared, cmd: Command) -> Result<Reply> {
    wait(&send(tx, shared, cmd)?)
}

/// Queues `cmd`, awaiting admission without blocking; the answer arrives on the returned
/// receiver. Requests queued one after another by one task apply in that order.
pub(crate) async fn send_async(
    tx: &Mailbox,
    shared: &Shared,
    cmd: Command,
) -> Result<tokio::sync::oneshot::Receiver<Result<Reply>>> {
    check_open(shared)?;
    let bytes = cmd.admission_bytes();
    shared.admission.take(bytes).await;
    let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
    let request = Request {
        cmd,
        reply: ReplyTo::Async(reply_tx),
        bytes,
    };
    if tx.send(request).is_err() {
        shared.admission.give_back(bytes);
        return Err(Error::Closed);
    }
    Ok(reply_rx)
}
