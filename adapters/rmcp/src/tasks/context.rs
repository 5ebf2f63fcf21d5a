//! The running side of a task: its future, a `WatchTask` follower that tells the future of
//! answers and cancel requests taken by any replica, the worker-lease keep-alive, and the
//! `FinishTask` that records how the future ended.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use cursorlog_proto::v1 as pb;
use rmcp::model::{CallToolResult, InputRequest};
use rmcp::task_manager::{TaskExit, TaskFuture};
use rmcp::ErrorData as McpError;
use tokio::sync::watch;
use tonic::Code;

use super::{internal, millis, Inner};
use crate::failover::{refusal, Op};

/// What the running future knows of its task (from the last `WatchTask` message).
#[derive(Debug, Clone, Default)]
struct Seen {
    version: u64,
    status: i32,
    cancel_requested: bool,
    outstanding: BTreeSet<String>,
    /// The task ended or is gone: nothing more will change.
    over: bool,
}

/// Handed to a task's future: the cursorlog counterpart of rmcp's `TaskContext`, with the
/// same methods (input requests, status message, cooperative cancel).
#[derive(Debug, Clone)]
pub struct CursorlogTaskContext {
    task_id: String,
    owner: String,
    inner: Arc<Inner>,
    seen: watch::Receiver<Seen>,
}

fn exit_error(message: String) -> TaskExit {
    TaskExit::Error(McpError::internal_error(message, None))
}

impl CursorlogTaskContext {
    /// The id of the task this context belongs to.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// Asks the client for input under `key` (unique over the task's life) and waits for its
    /// `tasks/update` answer, taken by any replica. While a request is outstanding `tasks/get`
    /// reports `input_required`.
    ///
    /// # Errors
    /// [`TaskExit::Cancelled`] when a cancel is requested (or the task ended) first;
    /// [`TaskExit::Error`] for a reused key or when cursorlog cannot be reached.
    pub async fn request_input(
        &self,
        key: impl Into<String>,
        request: InputRequest,
    ) -> Result<serde_json::Value, TaskExit> {
        let key = key.into();
        let json = serde_json::to_vec(&request)
            .map_err(|e| exit_error(format!("input request {key}: {e}")))?;
        let ask = pb::RequestInputRequest {
            owner: self.owner.clone(),
            task_id: self.task_id.clone(),
            requests: HashMap::from([(key.clone(), json)]),
            status_message: None,
        };
        let asked = self
            .inner
            .tasks(Op::Keyed(false), |mut c| {
                let r = ask.clone();
                async move { c.request_input(r).await }
            })
            .await;
        let version = match asked {
            Ok(r) => r.task.map_or(0, |t| t.version),
            Err(s) if s.code() == Code::FailedPrecondition && self.is_cancel_requested() => {
                return Err(TaskExit::Cancelled)
            }
            Err(s) => return Err(TaskExit::Error(internal("RequestInput", &s))),
        };
        let mut seen = self.seen.clone();
        let state = seen
            .wait_for(|s| {
                s.over
                    || s.cancel_requested
                    || (s.version >= version && !s.outstanding.contains(&key))
            })
            .await
            .map(|s| s.clone())
            .unwrap_or(Seen {
                over: true,
                ..Seen::default()
            });
        if state.cancel_requested || state.over {
            return Err(TaskExit::Cancelled);
        }
        self.answer(&key).await
    }

    /// Reads the answer to `key` from the task's answered input slots, whichever replica
    /// took the `tasks/update` (a linearizable read on the leader).
    async fn answer(&self, key: &str) -> Result<serde_json::Value, TaskExit> {
        let request = pb::GetTaskRequest {
            owner: self.owner.clone(),
            task_id: self.task_id.clone(),
            include_outcome: false,
        };
        let found = self
            .inner
            .tasks(Op::Read, |mut c| {
                let r = request.clone();
                async move { c.get_task(r).await }
            })
            .await
            .map_err(|s| TaskExit::Error(internal("GetTask", &s)))?;
        let payload = found
            .view
            .into_iter()
            .flat_map(|v| v.answered)
            .find(|slot| slot.key == key)
            .and_then(|slot| slot.response)
            .ok_or_else(|| {
                exit_error(format!("the answer to input request {key} is not readable"))
            })?;
        serde_json::from_slice(&payload).map_err(|e| exit_error(format!("answer {key}: {e}")))
    }

    /// Sets the task's status message (an `UpdateTask`, compare-and-set on the version seen).
    ///
    /// # Errors
    /// When cursorlog refuses it (the task ended) or cannot be reached.
    pub async fn set_status_message(&self, message: impl Into<String>) -> Result<(), McpError> {
        let message = message.into();
        for _ in 0..5 {
            let seen = self.seen.borrow().clone();
            let status = match pb::TaskStatus::try_from(seen.status) {
                Ok(pb::TaskStatus::InputRequired) => pb::TaskStatus::InputRequired,
                _ => pb::TaskStatus::Working,
            };
            let request = pb::UpdateTaskRequest {
                owner: self.owner.clone(),
                task_id: self.task_id.clone(),
                expected_version: (seen.version > 0).then_some(seen.version),
                status: status.into(),
                status_message: Some(message.clone()),
                ttl_ms: None,
                poll_interval_ms: None,
            };
            match self
                .inner
                .tasks(Op::Keyed(true), |mut c| {
                    let r = request.clone();
                    async move { c.update_task(r).await }
                })
                .await
            {
                Ok(_) => return Ok(()),
                Err(s) if s.code() == Code::Aborted => {
                    let mut rx = self.seen.clone();
                    let _ = rx.wait_for(|s| s.version != seen.version || s.over).await;
                }
                Err(s) => return Err(internal("UpdateTask", &s)),
            }
        }
        Err(McpError::internal_error(
            "UpdateTask: the task kept changing",
            None,
        ))
    }

    /// Whether a client asked to cancel the task (`tasks/cancel` on any replica).
    pub fn is_cancel_requested(&self) -> bool {
        self.seen.borrow().cancel_requested
    }

    /// Resolves once a cancel was requested (or the task ended); pair it with
    /// `tokio::select!` around long work and return [`TaskExit::Cancelled`].
    pub async fn cancelled(&self) {
        let mut seen = self.seen.clone();
        let _ = seen.wait_for(|s| s.cancel_requested || s.over).await;
    }
}

/// Starts the task's future with its watch and keep-alive, and its `FinishTask` at the end.
pub(super) fn run<F>(inner: Arc<Inner>, owner: &str, task: &pb::Task, make_future: F)
where
    F: FnOnce(CursorlogTaskContext) -> TaskFuture,
{
    let first = Seen {
        version: task.version,
        status: task.status,
        cancel_requested: task.cancel_requested,
        outstanding: BTreeSet::new(),
        over: false,
    };
    let (tx, rx) = watch::channel(first);
    let ctx = CursorlogTaskContext {
        task_id: task.task_id.clone(),
        owner: owner.to_owned(),
        inner: inner.clone(),
        seen: rx,
    };
    let watcher = tokio::spawn(follow(ctx.clone(), tx));
    let keeper = tokio::spawn(keep_alive(ctx.clone()));
    let future = make_future(ctx.clone());
    tokio::spawn(async move {
        let ended = future.await;
        keeper.abort();
        finish(&ctx, ended).await;
        watcher.abort();
    });
}

/// Follows the task with `WatchTask`, re-watching from the last version after a broken
/// stream or a leader change, until it ends.
async fn follow(ctx: CursorlogTaskContext, tx: watch::Sender<Seen>) {
    let mut after = 0;
    let mut failures = 0u32;
    loop {
        let request = pb::WatchTaskRequest {
            owner: ctx.owner.clone(),
            task_id: ctx.task_id.clone(),
            after_version: after,
        };
        let opened = ctx
            .inner
            .tasks(Op::Read, |mut c| {
                let r = request.clone();
                async move { c.watch_task(r).await }
            })
            .await;
        let mut stream = match opened {
            Ok(s) => s,
            Err(s) if refusal(&s).is_none() => {
                tracing::warn!(task = %ctx.task_id, error = %s, "cursorlog: cannot watch the task");
                tx.send_modify(|seen| seen.over = true);
                return;
            }
            Err(_) => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(failures.min(8)))).await;
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(change)) => {
                    failures = 0;
                    let found = change.verdict() == pb::TaskVerdict::TaskFound;
                    let Some(view) = change.view.filter(|_| found) else {
                        tx.send_modify(|seen| seen.over = true);
                        return;
                    };
                    let Some(task) = view.task else { continue };
                    after = task.version;
                    let terminal = matches!(
                        task.status(),
                        pb::TaskStatus::Completed
                            | pb::TaskStatus::Failed
                            | pb::TaskStatus::Cancelled
                    );
                    tx.send_replace(Seen {
                        version: task.version,
                        status: task.status,
                        cancel_requested: task.cancel_requested,
                        outstanding: view.outstanding.into_iter().map(|s| s.key).collect(),
                        over: terminal,
                    });
                    if terminal {
                        return;
                    }
                }
                Ok(None) => {
                    tx.send_modify(|seen| seen.over = true);
                    return;
                }
                Err(_) => {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(failures.min(8))))
                        .await;
                    break;
                }
            }
        }
    }
}

/// Renews the worker lease every third of it until aborted or the task ends.
async fn keep_alive(ctx: CursorlogTaskContext) {
    let every = ctx.inner.worker_lease / 3;
    let request = pb::KeepAliveTaskRequest {
        owner: ctx.owner.clone(),
        task_id: ctx.task_id.clone(),
    };
    loop {
        tokio::time::sleep(every).await;
        let renewed = ctx
            .inner
            .tasks(Op::Idempotent, |mut c| {
                let r = request.clone();
                async move { c.keep_alive_task(r).await }
            })
            .await;
        if let Err(s) = renewed {
            if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) {
                return;
            }
            tracing::warn!(task = %ctx.task_id, error = %s, lease_ms = millis(ctx.inner.worker_lease), "cursorlog: task lease not renewed");
        }
    }
}

/// Records how the future ended.
async fn finish(ctx: &CursorlogTaskContext, ended: Result<CallToolResult, TaskExit>) {
    use pb::task_outcome::Kind;
    let (status, outcome) = match &ended {
        Ok(result) => (
            pb::TaskStatus::Completed,
            Some((Kind::Result, serde_json::to_vec(result).unwrap_or_default())),
        ),
        Err(TaskExit::Cancelled) => (pb::TaskStatus::Cancelled, None),
        Err(TaskExit::Error(e)) => (
            pb::TaskStatus::Failed,
            Some((Kind::Error, serde_json::to_vec(e).unwrap_or_default())),
        ),
    };
    let request = pb::FinishTaskRequest {
        owner: ctx.owner.clone(),
        task_id: ctx.task_id.clone(),
        expected_version: None,
        status: status.into(),
        status_message: None,
        outcome: outcome.map(|(kind, json)| pb::TaskOutcome {
            kind: kind.into(),
            json,
        }),
    };
    let done = ctx
        .inner
        .tasks(Op::Idempotent, |mut c| {
            let r = request.clone();
            async move { c.finish_task(r).await }
        })
        .await;
    if let Err(s) = done {
        tracing::warn!(task = %ctx.task_id, error = %s, "cursorlog: the task's end was not recorded");
    }
}
