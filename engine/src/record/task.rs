//! The bodies of the task records (tags 16–27) and the private encoding of [`TaskMeta`] and [`InputSlot`], field by
//! field in the order FORMAT.md "Record bodies" gives. Enums are written as one `u8` code; a
//! code this build does not know does not decode.

use bincode::de::Decoder;
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{Decode, Encode};

use super::wire::wire_codec;
use crate::task::{
    EndCause, InputSlot, OutcomeKind, QueueState, QueuedMessage, SlotState, TaskMeta, TaskOutcome,
    TaskRemoval, TaskStatus,
};

/// Reads a `u8` code and maps it with `from_code`, naming `what` when it is not one.
fn decode_code<T, D: Decoder>(
    d: &mut D,
    what: &'static str,
    from_code: fn(u8) -> Option<T>,
) -> Result<T, DecodeError> {
    let code = u8::decode(d)?;
    from_code(code).ok_or_else(|| DecodeError::OtherString(format!("unknown {what} code {code}")))
}

fn decode_status<D: Decoder>(d: &mut D) -> Result<TaskStatus, DecodeError> {
    decode_code(d, "task status", TaskStatus::from_code)
}

/// [`TaskOutcome`] on disk: kind code, then the JSON bytes.
fn encode_outcome<E: Encoder>(o: &TaskOutcome, e: &mut E) -> Result<(), EncodeError> {
    o.kind.code().encode(e)?;
    o.json.encode(e)
}

fn decode_outcome<D: Decoder>(d: &mut D) -> Result<TaskOutcome, DecodeError> {
    Ok(TaskOutcome {
        kind: decode_code(d, "outcome kind", OutcomeKind::from_code)?,
        json: Vec::<u8>::decode(d)?,
    })
}

/// [`TaskMeta`] on disk: id, owner, task_id, request_key, status, status_message, version,
/// created_at_ms, updated_at_ms, ttl_ms, poll_interval_ms, worker_lease_ms,
/// cancel_requested, ended_at_ms, end_cause, deleted_at_ms, removal, outcome_kind, context.
pub(crate) fn encode_task<E: Encoder>(m: &TaskMeta, e: &mut E) -> Result<(), EncodeError> {
    m.id.encode(e)?;
    m.owner.encode(e)?;
    m.task_id.encode(e)?;
    m.request_key.encode(e)?;
    m.status.code().encode(e)?;
    m.status_message.encode(e)?;
    m.version.encode(e)?;
    m.created_at_ms.encode(e)?;
    m.updated_at_ms.encode(e)?;
    m.ttl_ms.encode(e)?;
    m.poll_interval_ms.encode(e)?;
    m.worker_lease_ms.encode(e)?;
    m.cancel_requested.encode(e)?;
    m.ended_at_ms.encode(e)?;
    m.end_cause.map(EndCause::code).encode(e)?;
    m.deleted_at_ms.encode(e)?;
    m.removal.map(TaskRemoval::code).encode(e)?;
    m.outcome_kind.code().encode(e)?;
    m.context.encode(e)
}

/// Reads what [`encode_task`] wrote.
pub(crate) fn decode_task<C, D: Decoder<Context = C>>(d: &mut D) -> Result<TaskMeta, DecodeError> {
    let optional = |code: Option<u8>, what: &str, ok: bool| -> Result<(), DecodeError> {
        match code {
            Some(c) if !ok => Err(DecodeError::OtherString(format!("unknown {what} code {c}"))),
            _ => Ok(()),
        }
    };
    let id = u64::decode(d)?;
    let owner = String::decode(d)?;
    let task_id = String::decode(d)?;
    let request_key = String::decode(d)?;
    let status = decode_status(d)?;
    let status_message = Option::<String>::decode(d)?;
    let version = u64::decode(d)?;
    let created_at_ms = u64::decode(d)?;
    let updated_at_ms = u64::decode(d)?;
    let ttl_ms = Option::<u64>::decode(d)?;
    let poll_interval_ms = u64::decode(d)?;
    let worker_lease_ms = Option::<u64>::decode(d)?;
    let cancel_requested = bool::decode(d)?;
    let ended_at_ms = Option::<u64>::decode(d)?;
    let end_code = Option::<u8>::decode(d)?;
    let end_cause = end_code.and_then(EndCause::from_code);
    optional(end_code, "end cause", end_cause.is_some())?;
    let deleted_at_ms = Option::<u64>::decode(d)?;
    let removal_code = Option::<u8>::decode(d)?;
    let removal = removal_code.and_then(TaskRemoval::from_code);
    optional(removal_code, "task removal", removal.is_some())?;
    let outcome_kind = decode_code(d, "outcome kind", OutcomeKind::from_code)?;
    let context = Vec::<u8>::decode(d)?;
    Ok(TaskMeta {
        id,
        owner,
        task_id,
        request_key,
        status,
        status_message,
        version,
        created_at_ms,
        updated_at_ms,
        ttl_ms,
        poll_interval_ms,
        worker_lease_ms,
        cancel_requested,
        ended_at_ms,
        end_cause,
        deleted_at_ms,
        removal,
        outcome_kind,
        context,
    })
}

/// [`InputSlot`] on disk: key, request, response, state code.
pub(crate) fn encode_slot<E: Encoder>(s: &InputSlot, e: &mut E) -> Result<(), EncodeError> {
    s.key.encode(e)?;
    s.request.encode(e)?;
    s.response.encode(e)?;
    s.state.code().encode(e)
}

/// Reads what [`encode_slot`] wrote.
pub(crate) fn decode_slot<D: Decoder>(d: &mut D) -> Result<InputSlot, DecodeError> {
    Ok(InputSlot {
        key: String::decode(d)?,
        request: Vec::<u8>::decode(d)?,
        response: Option::<Vec<u8>>::decode(d)?,
        state: decode_code(d, "input slot state", SlotState::from_code)?,
    })
}

/// [`QueuedMessage`] on disk: qseq, at_ms, dedupe_key, correlation, message.
pub(crate) fn encode_message<E: Encoder>(m: &QueuedMessage, e: &mut E) -> Result<(), EncodeError> {
    m.qseq.encode(e)?;
    m.at_ms.encode(e)?;
    m.dedupe_key.encode(e)?;
    m.correlation.encode(e)?;
    m.message.encode(e)
}

/// Reads what [`encode_message`] wrote.
pub(crate) fn decode_message<D: Decoder>(d: &mut D) -> Result<QueuedMessage, DecodeError> {
    Ok(QueuedMessage {
        qseq: u64::decode(d)?,
        at_ms: u64::decode(d)?,
        dedupe_key: Option::<String>::decode(d)?,
        correlation: Option::<String>::decode(d)?,
        message: Vec::<u8>::decode(d)?,
    })
}

/// [`QueueState`] on disk: head, tail, bytes, last_token.
pub(crate) fn encode_queue_state<E: Encoder>(q: &QueueState, e: &mut E) -> Result<(), EncodeError> {
    q.head.encode(e)?;
    q.tail.encode(e)?;
    q.bytes.encode(e)?;
    q.last_token.encode(e)
}

/// Reads what [`encode_queue_state`] wrote.
pub(crate) fn decode_queue_state<D: Decoder>(d: &mut D) -> Result<QueueState, DecodeError> {
    Ok(QueueState {
        head: u64::decode(d)?,
        tail: u64::decode(d)?,
        bytes: u64::decode(d)?,
        last_token: Option::<String>::decode(d)?,
    })
}

/// A u64 count, then each item (a count past the bytes left fails as the items decode,
/// without reserving memory for it).
fn encode_list<E: Encoder, T>(
    items: &[T],
    e: &mut E,
    one: impl Fn(&T, &mut E) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    (items.len() as u64).encode(e)?;
    items.iter().try_for_each(|i| one(i, e))
}

fn decode_list<D: Decoder, T>(
    d: &mut D,
    one: impl Fn(&mut D) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let n = u64::decode(d)?;
    let mut items = Vec::new();
    for _ in 0..n {
        items.push(one(d)?);
    }
    Ok(items)
}

/// One of a task's queues as a snapshot carries it: where it stands, its queued messages
/// and the last dequeued batch (for a retry of that dequeue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueSnapshot {
    pub channel: u8,
    pub state: QueueState,
    pub messages: Vec<QueuedMessage>,
    pub last_batch: Vec<QueuedMessage>,
}

wire_codec!(
    QueueSnapshot,
    |q, e| {
        q.channel.encode(e)?;
        encode_queue_state(&q.state, e)?;
        encode_list(&q.messages, e, |m, e| encode_message(m, e))?;
        encode_list(&q.last_batch, e, |m, e| encode_message(m, e))
    },
    |d| Ok(QueueSnapshot {
        channel: u8::decode(d)?,
        state: decode_queue_state(d)?,
        messages: decode_list(d, |d| decode_message(d))?,
        last_batch: decode_list(d, |d| decode_message(d))?,
    })
);

/// A message was enqueued on one of a task's queues (tag 22).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskQueued {
    pub id: u64,
    pub channel: u8,
    pub qseq: u64,
    /// The enqueuer's bound on the queue's length (the SDK's `maxSize`).
    pub max_len: u32,
    pub dedupe_key: Option<String>,
    pub correlation: Option<String>,
    pub message: Vec<u8>,
    pub at_ms: u64,
}

/// Messages up to `through_qseq` were dequeued, by a dequeue with `token` (tag 23).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskDequeued {
    pub id: u64,
    pub channel: u8,
    pub through_qseq: u64,
    pub token: String,
    pub at_ms: u64,
}

/// A task was created (tag 16). Its id is the record's LSN.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskCreated {
    pub id: u64,
    pub owner: String,
    pub task_id: String,
    pub request_key: String,
    pub ttl_ms: Option<u64>,
    pub poll_interval_ms: u64,
    pub worker_lease_ms: Option<u64>,
    pub status_message: Option<String>,
    pub context: Vec<u8>,
    pub at_ms: u64,
}

/// A running task's status, message or timing changed (tag 17). `None` fields keep their
/// value; `version` is the task's version after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskUpdated {
    pub id: u64,
    pub version: u64,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub ttl_ms: Option<u64>,
    pub poll_interval_ms: Option<u64>,
    pub at_ms: u64,
}

wire_codec!(
    TaskUpdated,
    |u, e| {
        u.id.encode(e)?;
        u.version.encode(e)?;
        u.status.code().encode(e)?;
        u.status_message.encode(e)?;
        u.ttl_ms.encode(e)?;
        u.poll_interval_ms.encode(e)?;
        u.at_ms.encode(e)
    },
    |d| Ok(TaskUpdated {
        id: u64::decode(d)?,
        version: u64::decode(d)?,
        status: decode_status(d)?,
        status_message: Option::<String>::decode(d)?,
        ttl_ms: Option::<u64>::decode(d)?,
        poll_interval_ms: Option::<u64>::decode(d)?,
        at_ms: u64::decode(d)?,
    })
);

/// A task asks its client for input (tag 18): one slot per (key, request JSON).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskInputRequested {
    pub id: u64,
    pub version: u64,
    pub requests: Vec<(String, Vec<u8>)>,
    pub status_message: Option<String>,
    pub at_ms: u64,
}

/// The client answered outstanding input requests (tag 19): (key, response JSON).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskInputAnswered {
    pub id: u64,
    pub version: u64,
    pub responses: Vec<(String, Vec<u8>)>,
    pub at_ms: u64,
}

/// A client asked to cancel a running task (tag 20): the 2026 cooperative cancel.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskCancelRequested {
    pub id: u64,
    pub version: u64,
    pub at_ms: u64,
}

/// A task reached its terminal status, with its outcome, in one record (tag 21).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskEnded {
    pub id: u64,
    pub version: u64,
    pub status: TaskStatus,
    pub cause: EndCause,
    pub status_message: Option<String>,
    pub outcome: TaskOutcome,
    pub at_ms: u64,
}

wire_codec!(
    TaskEnded,
    |t, e| {
        t.id.encode(e)?;
        t.version.encode(e)?;
        t.status.code().encode(e)?;
        t.cause.code().encode(e)?;
        t.status_message.encode(e)?;
        encode_outcome(&t.outcome, e)?;
        t.at_ms.encode(e)
    },
    |d| Ok(TaskEnded {
        id: u64::decode(d)?,
        version: u64::decode(d)?,
        status: decode_status(d)?,
        cause: decode_code(d, "end cause", EndCause::from_code)?,
        status_message: Option::<String>::decode(d)?,
        outcome: decode_outcome(d)?,
        at_ms: u64::decode(d)?,
    })
);

/// A task's content was deleted (tag 24); its tombstone stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskDeleted {
    pub id: u64,
    pub removal: TaskRemoval,
    pub at_ms: u64,
}

wire_codec!(
    TaskDeleted,
    |t, e| {
        t.id.encode(e)?;
        t.removal.code().encode(e)?;
        t.at_ms.encode(e)
    },
    |d| Ok(TaskDeleted {
        id: u64::decode(d)?,
        removal: decode_code(d, "task removal", TaskRemoval::from_code)?,
        at_ms: u64::decode(d)?,
    })
);

/// A task's whole state, carried forward before the segment that created it is retired
/// (tag 25): its meta, its outcome bytes, its input slots and its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskSnapshot {
    pub meta: TaskMeta,
    pub outcome: Vec<u8>,
    pub slots: Vec<InputSlot>,
    pub queues: Vec<QueueSnapshot>,
}

wire_codec!(
    TaskSnapshot,
    |s, e| {
        encode_task(&s.meta, e)?;
        s.outcome.encode(e)?;
        encode_list(&s.slots, e, |slot, e| encode_slot(slot, e))?;
        encode_list(&s.queues, e, |q, e| q.encode(e))
    },
    |d| Ok(TaskSnapshot {
        meta: decode_task(d)?,
        outcome: Vec::<u8>::decode(d)?,
        slots: decode_list(d, |d| decode_slot(d))?,
        queues: decode_list(d, |d| QueueSnapshot::decode(d))?,
    })
);

/// A deleted task past the metadata horizon is forgotten (tag 26): its tombstone goes, and
/// its id becomes unknown.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskForgotten {
    pub id: u64,
    pub at_ms: u64,
}

/// One inbound route of a task as [`TaskRoutes`] carries it: the correlation (the JSON-RPC
/// id of the outbound request), and the qseq of the inbound message that answered it
/// (`None`: still open).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct RouteEntry {
    pub correlation: String,
    pub inbound_qseq: Option<u64>,
}

/// A task's inbound routes, carried forward beside its [`TaskSnapshot`] (tag 27; written only
/// when the task has routes). Applied after the snapshot, it replaces the task's routes.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub(crate) struct TaskRoutes {
    pub id: u64,
    pub routes: Vec<RouteEntry>,
}
