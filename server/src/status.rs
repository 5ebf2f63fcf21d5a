//! The one mapping from engine errors to gRPC statuses.
//!
//! Every handler funnels engine failures through [`from_engine`], so a client sees the same
//! code for the same condition on every RPC. Messages name the field or state at fault and
//! never contain internal file paths; errors that would (I/O, corruption, lock, format) are
//! logged in full on the server and summarised to the client.

use cursorlog_engine::{Error, LiveLimit};
use tonic::{Code, Status};

/// The gRPC status for an engine error.
///
/// | engine error | code |
/// |---|---|
/// | `InvalidArgument` | `INVALID_ARGUMENT` |
/// | `TooLarge`, `DiskFull`, `AtCapacity`, `TaskQueueFull` | `RESOURCE_EXHAUSTED` |
/// | `UnknownSession`, `UnknownStream`, `UnknownTask` | `NOT_FOUND` |
/// | `TaskExists` | `ALREADY_EXISTS` |
/// | `StreamTerminated`, `StaleEpoch`, `SessionExpired`, `TaskTerminated`, `UnsupportedFormat` | `FAILED_PRECONDITION` |
/// | `SeqConflict`, `TaskConflict` | `ABORTED` |
/// | `Evicted` | `OUT_OF_RANGE` |
/// | `Corruption` | `DATA_LOSS` |
/// | `Poisoned`, `Io`, `Index`, `Closed`, `Locked`, `NotLeader` (leader in the `cursorlog-leader` header), `NotConfirmed` | `UNAVAILABLE` |
/// | `Internal` (and any variant added later) | `INTERNAL` |
pub fn from_engine(err: &Error) -> Status {
    let (code, message) = code_and_message(err);
    if matches!(err, Error::NotLeader { .. }) {
        // A redirect is normal operation on a cluster, not an error (issue 30 item 2).
        tracing::debug!(error = %err, "redirected: not the leader");
    } else if matches!(err, Error::NotConfirmed(_)) {
        tracing::info!(error = %err, "answered outcome-unknown (retryable)");
    } else if matches!(code, Code::DataLoss | Code::Unavailable | Code::Internal)
        || matches!(err, Error::UnsupportedFormat { .. })
    {
        // The full error (with paths) stays in the server log.
        tracing::error!(error = %err, code = ?code, "request failed");
    } else if matches!(err, Error::DiskFull { .. }) {
        tracing::warn!(error = %err, "append refused: disk below its free-space reserve");
    } else if matches!(err, Error::AtCapacity { .. }) {
        tracing::warn!(error = %err, "request refused: a cap on live state is reached");
    }
    let status = Status::new(code, message);
    match err {
        Error::NotLeader { leader } => crate::cluster::retry_is(
            crate::cluster::with_leader(status, leader.as_deref()),
            crate::cluster::Retry::Safe,
        ),
        Error::NotConfirmed(_) => {
            crate::cluster::retry_is(status, crate::cluster::Retry::OutcomeUnknown)
        }
        _ => status,
    }
}

fn code_and_message(err: &Error) -> (Code, String) {
    match err {
        Error::InvalidArgument { .. } => (Code::InvalidArgument, err.to_string()),
        Error::TooLarge { .. } | Error::DiskFull { .. } => {
            (Code::ResourceExhausted, err.to_string())
        }
        Error::AtCapacity { limit, max } => (Code::ResourceExhausted, at_capacity(*limit, *max)),
        Error::UnknownSession => (
            Code::NotFound,
            "session not found: it was never opened or is past its metadata horizon".into(),
        ),
        Error::UnknownStream(stream) => (
            Code::NotFound,
            format!("stream {stream} not found in this session"),
        ),
        Error::StreamTerminated { .. } | Error::StaleEpoch { .. } => {
            (Code::FailedPrecondition, err.to_string())
        }
        Error::SessionExpired => (Code::FailedPrecondition, "session is expired".into()),
        Error::SeqConflict { .. } => (Code::Aborted, err.to_string()),
        // Another owner's task is this too: its existence is never revealed.
        Error::UnknownTask { task_id } => (Code::NotFound, format!("task not found: {task_id:?}")),
        Error::TaskExists { .. } => (Code::AlreadyExists, err.to_string()),
        Error::TaskTerminated { task_id, status } => (
            Code::FailedPrecondition,
            format!("task is {status}: task {task_id:?} ended and never changes again"),
        ),
        Error::TaskConflict { .. } => (Code::Aborted, err.to_string()),
        Error::TaskQueueFull { .. } => (Code::ResourceExhausted, err.to_string()),
        Error::Evicted { .. } => (Code::OutOfRange, err.to_string()),
        Error::Corruption { offset, kind, .. } => (
            Code::DataLoss,
            format!("stored data failed its check at segment offset {offset}: {kind}"),
        ),
        Error::Poisoned | Error::NotLeader { .. } | Error::NotConfirmed(_) => {
            (Code::Unavailable, err.to_string())
        }
        Error::Io { .. } => (
            Code::Unavailable,
            "storage i/o failure; the server log has the details".into(),
        ),
        Error::Index(_) => (
            Code::Unavailable,
            "index failure; the server log has the details".into(),
        ),
        Error::Closed => (Code::Unavailable, "server is shutting down".into()),
        Error::Locked { .. } => (
            Code::Unavailable,
            "data directory is locked by another process".into(),
        ),
        Error::UnsupportedFormat { .. } => (
            Code::FailedPrecondition,
            "data directory has an unsupported on-disk format; the server log has the details"
                .into(),
        ),
        Error::Internal(_) => (
            Code::Internal,
            "internal error (a server bug); the server log has the details".into(),
        ),
        // `Error` is non-exhaustive: a variant added later is reported, not hidden.
        _ => (
            Code::Internal,
            "internal error; the server log has the details".into(),
        ),
    }
}

/// The server flag (and its environment variable) that sets a cap on live state.
pub fn limit_flag(limit: LiveLimit) -> (&'static str, &'static str) {
    match limit {
        LiveLimit::Sessions => ("--max-live-sessions", "CURSORLOG_MAX_LIVE_SESSIONS"),
        LiveLimit::LeasedStreams => ("--max-leased-streams", "CURSORLOG_MAX_LEASED_STREAMS"),
        LiveLimit::TasksPerOwner => ("--max-tasks-per-owner", "CURSORLOG_MAX_TASKS_PER_OWNER"),
        LiveLimit::Tasks => ("--max-tasks", "CURSORLOG_MAX_TASKS"),
        // `LiveLimit` is non-exhaustive: a cap added later still gets an answer.
        _ => ("(see cursorlog serve --help)", "CURSORLOG_*"),
    }
}

/// What a client told "at capacity" reads: which cap, its value, what frees room, and the
/// flag that raises it.
fn at_capacity(limit: LiveLimit, max: u64) -> String {
    let (flag, env) = limit_flag(limit);
    let frees = match limit {
        LiveLimit::Sessions => "until idle sessions expire or are expired",
        LiveLimit::TasksPerOwner | LiveLimit::Tasks => {
            "until some are deleted or expire (a task ended is deleted one TTL after its end)"
        }
        _ => "until some of them end",
    };
    format!(
        "{limit} are at the server's limit of {max}: refused {frees}; \
         an operator raises it with {flag} ({env})"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cursorlog_engine::{CorruptionKind, StreamState};
    use std::path::PathBuf;

    fn secret_path() -> PathBuf {
        PathBuf::from("/very/secret/data/00000000000000000001.seg")
    }

    #[test]
    fn every_error_maps_to_its_code() {
        let io = std::io::Error::other("disk on fire");
        let cases: Vec<(Error, Code)> = vec![
            (
                Error::InvalidArgument {
                    field: "session",
                    reason: "is empty".into(),
                },
                Code::InvalidArgument,
            ),
            (
                Error::TooLarge {
                    what: "payload bytes",
                    got: 9,
                    limit: 8,
                },
                Code::ResourceExhausted,
            ),
            (Error::UnknownSession, Code::NotFound),
            (Error::UnknownStream(7), Code::NotFound),
            (
                Error::StreamTerminated {
                    stream: 7,
                    state: StreamState::Completed,
                    terminal_seq: 3,
                },
                Code::FailedPrecondition,
            ),
            (
                Error::StaleEpoch {
                    given: 1,
                    current: 2,
                },
                Code::FailedPrecondition,
            ),
            (Error::SessionExpired, Code::FailedPrecondition),
            (
                Error::SeqConflict {
                    stream: 7,
                    expected: 9,
                    head: 3,
                    reason: "gap",
                },
                Code::Aborted,
            ),
            (
                Error::Evicted {
                    stream: 7,
                    seq: 1,
                    watermark: 5,
                },
                Code::OutOfRange,
            ),
            (
                Error::Corruption {
                    segment: secret_path(),
                    offset: 40,
                    kind: CorruptionKind::BadMagic,
                },
                Code::DataLoss,
            ),
            (Error::Poisoned, Code::Unavailable),
            (Error::NotLeader { leader: None }, Code::Unavailable),
            (Error::NotConfirmed("lost".into()), Code::Unavailable),
            (
                Error::Io {
                    context: format!("writing {}", secret_path().display()),
                    source: io,
                },
                Code::Unavailable,
            ),
            (Error::Closed, Code::Unavailable),
            (
                Error::DiskFull {
                    free_bytes: 10,
                    reserve_bytes: 20,
                },
                Code::ResourceExhausted,
            ),
            (
                Error::AtCapacity {
                    limit: LiveLimit::Sessions,
                    max: 5,
                },
                Code::ResourceExhausted,
            ),
            (
                Error::Internal(format!(
                    "writer answered oddly for {}",
                    secret_path().display()
                )),
                Code::Internal,
            ),
            (Error::Locked { dir: secret_path() }, Code::Unavailable),
            (
                Error::UnsupportedFormat {
                    path: secret_path(),
                    reason: "version 9".into(),
                },
                Code::FailedPrecondition,
            ),
        ];
        for (err, code) in cases {
            let status = from_engine(&err);
            assert_eq!(status.code(), code, "{err}");
            assert!(
                !status.message().contains("/very/secret"),
                "{err} leaks a path"
            );
            assert!(!status.message().is_empty());
        }
    }

    #[test]
    fn messages_name_the_field_or_state() {
        let status = from_engine(&Error::InvalidArgument {
            field: "kind",
            reason: "too long".into(),
        });
        assert!(status.message().contains("kind"), "{}", status.message());
        let status = from_engine(&Error::StreamTerminated {
            stream: 42,
            state: StreamState::Aborted,
            terminal_seq: 3,
        });
        assert!(status.message().contains("42") && status.message().contains("aborted"));
        let status = from_engine(&Error::StaleEpoch {
            given: 1,
            current: 2,
        });
        assert!(status.message().contains("epoch"));
    }

    #[test]
    fn an_answer_at_capacity_names_the_limit_and_the_flag() {
        for (limit, flag, env) in [
            (
                LiveLimit::Sessions,
                "--max-live-sessions",
                "CURSORLOG_MAX_LIVE_SESSIONS",
            ),
            (
                LiveLimit::LeasedStreams,
                "--max-leased-streams",
                "CURSORLOG_MAX_LEASED_STREAMS",
            ),
            (
                LiveLimit::TasksPerOwner,
                "--max-tasks-per-owner",
                "CURSORLOG_MAX_TASKS_PER_OWNER",
            ),
            (LiveLimit::Tasks, "--max-tasks", "CURSORLOG_MAX_TASKS"),
        ] {
            let status = from_engine(&Error::AtCapacity { limit, max: 1234 });
            assert_eq!(status.code(), Code::ResourceExhausted);
            let m = status.message();
            assert!(
                m.contains("1234") && m.contains(flag) && m.contains(env),
                "{m}"
            );
            assert!(m.contains(&limit.to_string()), "{m}");
        }
    }

    #[test]
    fn task_errors_map_to_their_codes_and_name_the_state() {
        use cursorlog_engine::TaskStatus;
        let status = from_engine(&Error::UnknownTask {
            task_id: "t1".into(),
        });
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().starts_with("task not found"), "{status:?}");
        let status = from_engine(&Error::TaskExists {
            task_id: "t1".into(),
        });
        assert_eq!(status.code(), Code::AlreadyExists);
        for s in [
            TaskStatus::Completed,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ] {
            let status = from_engine(&Error::TaskTerminated {
                task_id: "t1".into(),
                status: s,
            });
            assert_eq!(status.code(), Code::FailedPrecondition);
            assert!(
                status.message().contains(&format!("task is {s}")),
                "{status:?}"
            );
        }
        let status = from_engine(&Error::TaskConflict {
            task_id: "t1".into(),
            expected_version: 2,
            version: 3,
        });
        assert_eq!(status.code(), Code::Aborted);
        assert!(status.message().contains("version 3"), "{status:?}");
    }
}
