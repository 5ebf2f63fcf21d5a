//! Conversions between the `tasks.proto` messages and the engine's task API, with request
//! validation (docs/TASKS-DESIGN.md §3).
//!
//! As for the event log, validation here is structural: a required field that is missing or
//! empty, or an enum left at its UNSPECIFIED value where a choice is required, is refused
//! with `INVALID_ARGUMENT` naming the field. Lengths and sizes are the engine's to check.
//!
//! Maps (`requests`, `responses`) reach the engine sorted by key, so the same request always
//! writes the same record whatever order the client's map iterated in.

use std::collections::HashMap;

use cursorlog_engine as engine;
use cursorlog_engine::{
    CancelMode, EndCause, OutcomeKind, TaskMeta, TaskOutcome, TaskRef, TaskStatus, TaskVerdict,
};
use cursorlog_proto::v1 as pb;
use tonic::Status;

use super::required_str;

/// The task `task_id` of `owner` (the owner may be empty: a shared namespace).
///
/// # Errors
/// `INVALID_ARGUMENT` when `task_id` is empty.
pub fn task_ref(owner: String, task_id: String) -> Result<TaskRef, Status> {
    Ok(TaskRef {
        owner,
        task_id: required_str("task_id", task_id)?,
    })
}

/// A status the request must name.
///
/// # Errors
/// `INVALID_ARGUMENT` naming `status` for `TASK_STATUS_UNSPECIFIED` or an unknown number.
pub fn required_status(value: i32) -> Result<TaskStatus, Status> {
    match pb::TaskStatus::try_from(value) {
        Ok(pb::TaskStatus::Working) => Ok(TaskStatus::Working),
        Ok(pb::TaskStatus::InputRequired) => Ok(TaskStatus::InputRequired),
        Ok(pb::TaskStatus::Completed) => Ok(TaskStatus::Completed),
        Ok(pb::TaskStatus::Failed) => Ok(TaskStatus::Failed),
        Ok(pb::TaskStatus::Cancelled) => Ok(TaskStatus::Cancelled),
        Ok(pb::TaskStatus::Unspecified) => Err(Status::invalid_argument(
            "status is required: TASK_STATUS_UNSPECIFIED names no status",
        )),
        Err(_) => Err(Status::invalid_argument(format!(
            "status {value} is not a TaskStatus"
        ))),
    }
}

/// The wire form of a status.
pub fn status(status: TaskStatus) -> pb::TaskStatus {
    match status {
        TaskStatus::Working => pb::TaskStatus::Working,
        TaskStatus::InputRequired => pb::TaskStatus::InputRequired,
        TaskStatus::Completed => pb::TaskStatus::Completed,
        TaskStatus::Failed => pb::TaskStatus::Failed,
        TaskStatus::Cancelled => pb::TaskStatus::Cancelled,
    }
}

fn end_cause(cause: Option<EndCause>) -> pb::TaskEndCause {
    match cause {
        None => pb::TaskEndCause::Unspecified,
        Some(EndCause::Client) => pb::TaskEndCause::Client,
        Some(EndCause::TtlExpired) => pb::TaskEndCause::TtlExpired,
        Some(EndCause::LeaseExpired) => pb::TaskEndCause::LeaseExpired,
        Some(EndCause::Fenced) => pb::TaskEndCause::Fenced,
    }
}

/// The wire form of a task (its owner is the caller's, so it is not repeated).
pub fn task(meta: TaskMeta) -> pb::Task {
    pb::Task {
        task_id: meta.task_id,
        status: status(meta.status).into(),
        status_message: meta.status_message,
        created_at_ms: meta.created_at_ms,
        last_updated_at_ms: meta.updated_at_ms,
        ttl_ms: meta.ttl_ms,
        poll_interval_ms: meta.poll_interval_ms,
        version: meta.version,
        cancel_requested: meta.cancel_requested,
        context: meta.context,
        request_key: meta.request_key,
        worker_lease_ms: meta.worker_lease_ms,
        ended_at_ms: meta.ended_at_ms,
        end_cause: end_cause(meta.end_cause).into(),
    }
}

/// A create request.
///
/// # Errors
/// `INVALID_ARGUMENT` when `task_id` or `request_key` is empty.
pub fn new_task(r: pb::CreateTaskRequest) -> Result<engine::NewTask, Status> {
    Ok(engine::NewTask {
        owner: r.owner,
        task_id: required_str("task_id", r.task_id)?,
        request_key: required_str("request_key", r.request_key)?,
        ttl_ms: r.ttl_ms,
        poll_interval_ms: r.poll_interval_ms,
        worker_lease_ms: r.worker_lease_ms,
        status_message: r.status_message,
        context: r.context,
    })
}

/// An update of a running task.
///
/// # Errors
/// `INVALID_ARGUMENT` for an empty `task_id` or a missing `status`.
pub fn change(r: pb::UpdateTaskRequest) -> Result<engine::TaskChange, Status> {
    Ok(engine::TaskChange {
        task: task_ref(r.owner, r.task_id)?,
        expected_version: r.expected_version,
        status: required_status(r.status)?,
        status_message: r.status_message,
        ttl_ms: r.ttl_ms,
        poll_interval_ms: r.poll_interval_ms,
    })
}

/// An outcome in a request: absent (or `KIND_UNSPECIFIED` with no bytes) is none.
///
/// # Errors
/// `INVALID_ARGUMENT` for bytes without a kind, or an unknown kind.
pub fn outcome_in(outcome: Option<pb::TaskOutcome>) -> Result<TaskOutcome, Status> {
    let Some(o) = outcome else {
        return Ok(TaskOutcome::none());
    };
    let kind = match pb::task_outcome::Kind::try_from(o.kind) {
        Ok(pb::task_outcome::Kind::Unspecified) if o.json.is_empty() => OutcomeKind::None,
        Ok(pb::task_outcome::Kind::Unspecified) => {
            return Err(Status::invalid_argument(
                "outcome.kind is required when outcome.json is set: RESULT or ERROR",
            ))
        }
        Ok(pb::task_outcome::Kind::Result) => OutcomeKind::Result,
        Ok(pb::task_outcome::Kind::Error) => OutcomeKind::Error,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "outcome.kind {} is not a TaskOutcome.Kind",
                o.kind
            )))
        }
    };
    Ok(TaskOutcome { kind, json: o.json })
}

/// The wire form of an outcome (`None` for no outcome).
pub fn outcome(outcome: TaskOutcome) -> Option<pb::TaskOutcome> {
    let kind = match outcome.kind {
        OutcomeKind::None => return None,
        OutcomeKind::Result => pb::task_outcome::Kind::Result,
        OutcomeKind::Error => pb::task_outcome::Kind::Error,
    };
    Some(pb::TaskOutcome {
        kind: kind.into(),
        json: outcome.json,
    })
}

/// An end of a task.
///
/// # Errors
/// `INVALID_ARGUMENT` for an empty `task_id`, a missing `status`, or a malformed outcome.
pub fn finish(r: pb::FinishTaskRequest) -> Result<engine::TaskFinish, Status> {
    Ok(engine::TaskFinish {
        task: task_ref(r.owner, r.task_id)?,
        expected_version: r.expected_version,
        status: required_status(r.status)?,
        status_message: r.status_message,
        outcome: outcome_in(r.outcome)?,
    })
}

/// A map's entries sorted by key: the engine gets the same list for the same request.
pub fn sorted(map: HashMap<String, Vec<u8>>) -> Vec<(String, Vec<u8>)> {
    let mut pairs: Vec<_> = map.into_iter().collect();
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    pairs
}

/// An input request of a task.
///
/// # Errors
/// `INVALID_ARGUMENT` for an empty `task_id` or no requests.
pub fn input_request(r: pb::RequestInputRequest) -> Result<engine::TaskInputRequest, Status> {
    if r.requests.is_empty() {
        return Err(Status::invalid_argument(
            "requests is required: at least one key and its request",
        ));
    }
    Ok(engine::TaskInputRequest {
        task: task_ref(r.owner, r.task_id)?,
        requests: sorted(r.requests),
        status_message: r.status_message,
    })
}

/// The client's answers.
///
/// # Errors
/// `INVALID_ARGUMENT` for an empty `task_id` or no responses.
pub fn input_answer(r: pb::AnswerInputRequest) -> Result<engine::TaskInputAnswer, Status> {
    if r.responses.is_empty() {
        return Err(Status::invalid_argument(
            "responses is required: at least one key and its response",
        ));
    }
    Ok(engine::TaskInputAnswer {
        task: task_ref(r.owner, r.task_id)?,
        responses: sorted(r.responses),
    })
}

/// A cancel.
///
/// # Errors
/// `INVALID_ARGUMENT` for an empty `task_id` or a missing `mode`.
pub fn cancel(r: pb::CancelTaskRequest) -> Result<engine::TaskCancel, Status> {
    let mode = match pb::cancel_task_request::Mode::try_from(r.mode) {
        Ok(pb::cancel_task_request::Mode::Request) => CancelMode::Request,
        Ok(pb::cancel_task_request::Mode::Terminal) => CancelMode::Terminal,
        Ok(pb::cancel_task_request::Mode::Unspecified) => {
            return Err(Status::invalid_argument(
                "mode is required: REQUEST (cooperative) or TERMINAL (cancel now)",
            ))
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "mode {} is not a CancelTaskRequest.Mode",
                r.mode
            )))
        }
    };
    Ok(engine::TaskCancel {
        task: task_ref(r.owner, r.task_id)?,
        mode,
        status_message: r.status_message,
    })
}

/// A lookup's answer.
pub fn view(view: engine::TaskView) -> pb::GetTaskResponse {
    let verdict = match view.verdict {
        TaskVerdict::Found => pb::TaskVerdict::TaskFound,
        TaskVerdict::Expired => pb::TaskVerdict::TaskExpired,
        TaskVerdict::Deleted => pb::TaskVerdict::TaskDeleted,
        TaskVerdict::Unknown => pb::TaskVerdict::TaskUnknown,
    };
    let tombstone = matches!(view.verdict, TaskVerdict::Expired | TaskVerdict::Deleted);
    let (deleted_at_ms, final_status) = match (&view.task, tombstone) {
        (Some(meta), true) => (meta.deleted_at_ms, status(meta.status)),
        _ => (None, pb::TaskStatus::Unspecified),
    };
    let slots = |slots: Vec<engine::InputSlot>| -> Vec<pb::InputSlot> {
        slots
            .into_iter()
            .map(|slot| pb::InputSlot {
                key: slot.key,
                request: slot.request,
                response: slot.response,
            })
            .collect()
    };
    let outstanding = slots(view.outstanding);
    let answered = slots(view.answered);
    let (outbound_queued, inbound_queued) = (view.outbound_queued, view.inbound_queued);
    let task_view = view.task.map(|meta| pb::TaskView {
        task: Some(task(meta)),
        outstanding,
        answered,
        outcome: view.outcome.and_then(outcome),
        outbound_queued,
        inbound_queued,
    });
    pb::GetTaskResponse {
        verdict: verdict.into(),
        view: task_view,
        deleted_at_ms,
        final_status: final_status.into(),
    }
}

/// The characters of base64url (RFC 4648 §5).
const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
/// Characters of an encoded list cursor: 8 bytes, base64url without padding.
const CURSOR_CHARS: usize = 11;

/// A list cursor: the engine id of the page's last task, its 8 big-endian bytes in
/// base64url without padding (11 characters). Opaque to clients.
pub fn encode_cursor(id: u64) -> String {
    let bits = u128::from(id) << 2; // 66 bits: 11 groups of 6.
    (0..CURSOR_CHARS)
        .rev()
        .map(|i| char::from(BASE64URL[((bits >> (6 * i)) & 0x3f) as usize]))
        .collect()
}

/// The engine id a list cursor names (`None` for the empty cursor: the first page).
///
/// # Errors
/// `INVALID_ARGUMENT` naming `cursor` when it is not one this server handed out.
pub fn decode_cursor(cursor: &str) -> Result<Option<u64>, Status> {
    if cursor.is_empty() {
        return Ok(None);
    }
    let bad = || {
        Status::invalid_argument(
            "cursor does not decode: pass a next_cursor from a ListTasks answer unchanged, or \
             an empty cursor for the first page",
        )
    };
    if cursor.len() != CURSOR_CHARS {
        return Err(bad());
    }
    let mut bits = 0_u128;
    for c in cursor.bytes() {
        let digit = BASE64URL.iter().position(|b| *b == c).ok_or_else(bad)?;
        bits = (bits << 6) | digit as u128;
    }
    // The two padding bits must be zero: one id has exactly one cursor.
    if bits & 0b11 != 0 {
        return Err(bad());
    }
    u64::try_from(bits >> 2).map(Some).map_err(|_| bad())
}

/// A list page.
pub fn page(page: engine::TaskPage) -> pb::ListTasksResponse {
    pb::ListTasksResponse {
        tasks: page.tasks.into_iter().map(task).collect(),
        next_cursor: page.next.map(encode_cursor).unwrap_or_default(),
    }
}

/// A queue channel: 0 outbound, 1 inbound.
///
/// # Errors
/// `INVALID_ARGUMENT` naming `channel` for any other number.
pub fn channel(value: u32) -> Result<u8, Status> {
    u8::try_from(value)
        .ok()
        .filter(|c| *c <= engine::INBOUND)
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "invalid channel: {value} (0 is the outbound queue, 1 the inbound one)"
            ))
        })
}

/// An enqueue request.
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing task id or a bad channel.
pub fn enqueue(r: pb::EnqueueTaskMessageRequest) -> Result<engine::TaskEnqueue, Status> {
    Ok(engine::TaskEnqueue {
        task: task_ref(r.owner, r.task_id)?,
        channel: channel(r.channel)?,
        message: r.message,
        max_len: r.max_len,
        dedupe_key: r.dedupe_key,
        correlation: r.correlation,
    })
}

/// A dequeue request.
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing task id or token, or a bad channel.
pub fn dequeue(r: pb::DequeueTaskMessagesRequest) -> Result<engine::TaskDequeue, Status> {
    Ok(engine::TaskDequeue {
        task: task_ref(r.owner, r.task_id)?,
        channel: channel(r.channel)?,
        max_messages: r.max_messages,
        token: required_str("token", r.token)?,
    })
}

/// A dequeue's answer.
pub fn dequeued(d: engine::TaskDequeued) -> pb::DequeueTaskMessagesResponse {
    pb::DequeueTaskMessagesResponse {
        messages: d
            .messages
            .into_iter()
            .map(|m| pb::QueuedTaskMessage {
                qseq: m.qseq,
                message: m.message,
                at_ms: m.at_ms,
                correlation: m.correlation,
            })
            .collect(),
        duplicate: d.duplicate,
    }
}

/// A routing request (the inbound channel).
///
/// # Errors
/// `INVALID_ARGUMENT` naming `correlation` when it is empty.
pub fn route(r: pb::RouteTaskMessageRequest) -> Result<engine::TaskRoute, Status> {
    Ok(engine::TaskRoute {
        owner: r.owner,
        correlation: required_str("correlation", r.correlation)?,
        message: r.message,
    })
}

/// A routing's answer.
pub fn routed(r: engine::TaskRouted) -> pb::RouteTaskMessageResponse {
    pb::RouteTaskMessageResponse {
        routed: r.routed,
        task_id: r.task_id,
        qseq: r.qseq,
        duplicate: r.duplicate,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tonic::Code;

    #[test]
    fn cursors_round_trip_and_are_base64url_of_the_big_endian_id() {
        for id in [
            0,
            1,
            63,
            64,
            4096,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let text = encode_cursor(id);
            assert_eq!(text.len(), CURSOR_CHARS);
            assert_eq!(decode_cursor(&text).unwrap(), Some(id), "{text}");
        }
        // 8 BE bytes 00 00 00 00 00 00 00 01 in base64url without padding.
        assert_eq!(encode_cursor(1), "AAAAAAAAAAE");
        assert_eq!(encode_cursor(u64::MAX), "__________8");
        assert_eq!(decode_cursor("").unwrap(), None);
    }

    #[test]
    fn a_cursor_that_does_not_decode_is_invalid_argument_naming_the_field() {
        for bad in [
            "x",
            "AAAAAAAAAA=",
            "AAAAAAAAAAB",
            "AAAAAAAAAA+",
            "AAAAAAAAAAAA",
            "é",
        ] {
            let err = decode_cursor(bad).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{bad}");
            assert!(err.message().contains("cursor"), "{}", err.message());
        }
    }

    #[test]
    fn statuses_map_one_to_one_and_unspecified_is_refused() {
        for s in TaskStatus::ALL {
            assert_eq!(required_status(status(s).into()).unwrap(), s);
        }
        let err = required_status(0).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("status"));
        assert_eq!(
            required_status(99).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn maps_reach_the_engine_sorted_by_key() {
        let map: HashMap<String, Vec<u8>> = ["c", "a", "b", "aa"]
            .into_iter()
            .map(|k| (k.to_owned(), k.as_bytes().to_vec()))
            .collect();
        let keys: Vec<_> = sorted(map).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "aa", "b", "c"]);
    }

    #[test]
    fn outcomes_need_a_kind_for_their_bytes() {
        assert_eq!(outcome_in(None).unwrap(), TaskOutcome::none());
        let none = pb::TaskOutcome {
            kind: 0,
            json: Vec::new(),
        };
        assert_eq!(outcome_in(Some(none)).unwrap(), TaskOutcome::none());
        let unkinded = pb::TaskOutcome {
            kind: 0,
            json: b"{}".to_vec(),
        };
        assert_eq!(
            outcome_in(Some(unkinded)).unwrap_err().code(),
            Code::InvalidArgument
        );
        let result = TaskOutcome {
            kind: OutcomeKind::Result,
            json: b"{\"ok\":1}".to_vec(),
        };
        assert_eq!(outcome_in(outcome(result.clone())).unwrap(), result);
        assert_eq!(outcome(TaskOutcome::none()), None);
    }

    #[test]
    fn required_fields_are_named() {
        let err = new_task(pb::CreateTaskRequest {
            task_id: "t".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.message().contains("request_key"), "{}", err.message());
        let err = cancel(pb::CancelTaskRequest {
            task_id: "t".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.message().contains("mode"), "{}", err.message());
        let err = task_ref("o".into(), String::new()).unwrap_err();
        assert!(err.message().contains("task_id"), "{}", err.message());
        let err = route(pb::RouteTaskMessageRequest {
            owner: "s:a".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("correlation"), "{}", err.message());
    }
}
