//! Durable MCP Tasks (SEP-2663, `io.modelcontextprotocol/tasks`) on cursorlog's `Tasks`
//! service: [`CursorlogTaskManager`] has the method shapes of rmcp's in-memory
//! `TaskManager` (`spawn`, `get_task`, `update_task`, `cancel_task`), but the task lives in
//! cursorlog, so `tasks/get`, `tasks/update` and `tasks/cancel` are answered by *any* replica
//! (docs/TASKS-DESIGN.md §4.2).
//!
//! ```no_run
//! # use rmcp::model::*; use rmcp::service::RequestContext; use rmcp::RoleServer;
//! # use cursorlog_rmcp::tasks::{owner_of, CursorlogTaskManager};
//! # struct S { tasks: CursorlogTaskManager }
//! # impl S {
//! async fn get_task(&self, request: GetTaskParams, context: RequestContext<RoleServer>)
//!     -> Result<GetTaskResult, ErrorData> {
//!     let task = self.tasks.get_task(&owner_of(&context), &request.task_id).await?;
//!     Ok(GetTaskResult::new(task))
//! }
//! # }
//! ```
//!
//! Where rmcp's API forced a shape:
//! - rmcp's `TaskManager` is a concrete type and its `TaskContext` has private fields, so a
//!   task's future receives a [`CursorlogTaskContext`] instead (same methods).
//! - `spawn` awaits the durable `CreateTask`, so it is `async` and fallible, and takes the
//!   task's owner (rmcp's in-memory manager has no owners: its tasks are one process's).
//! - `set_status_message` is a write, so it is `async` and returns its outcome.
//! - An answer given through `tasks/update` on another replica reaches the replica that runs
//!   the task through cursorlog: the worker watches the task, and once the key is no longer
//!   outstanding reads the answer from the task's answered input slots (`GetTask`).
//! - rmcp's `ORIGINATING_REQUEST` scope (SEP-2260) is crate-private: a task's future does not
//!   run inside its originating request's association scope.

mod context;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::tasks_client::TasksClient;
use rmcp::model::{DetailedTask, InputRequests, JsonObject, Task, TaskPayload, TaskStatus};
use rmcp::service::RequestContext;
use rmcp::task_manager::TaskOptions;
use rmcp::{ErrorData as McpError, RoleServer};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

pub use context::CursorlogTaskContext;
pub use rmcp::task_manager::{TaskExit, TaskFuture};

use crate::failover::{Conn, Op};
use crate::BearerToken;

/// The gRPC client of cursorlog's `Tasks` service on one member.
pub(crate) type TasksRaw = TasksClient<InterceptedService<Channel, BearerToken>>;

fn tasks_raw(channel: Channel, token: &BearerToken) -> TasksRaw {
    TasksClient::with_interceptor(channel, token.clone())
}

/// The owner of the tasks a request may see: `a:<sha256 of Authorization>` when the HTTP
/// request carried one, else `s:<Mcp-Session-Id>`, else `""` (one shared namespace: a
/// stateless, unauthenticated deployment).
pub fn owner_of(context: &RequestContext<RoleServer>) -> String {
    let Some(parts) = context.extensions.get::<http::request::Parts>() else {
        return String::new();
    };
    owner_of_headers(&parts.headers)
}

/// [`owner_of`] on the HTTP headers.
pub fn owner_of_headers(headers: &http::HeaderMap) -> String {
    use sha2::Digest;
    if let Some(auth) = headers.get(http::header::AUTHORIZATION) {
        let digest = sha2::Sha256::digest(auth.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        return format!("a:{hex}");
    }
    match headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) {
        Some(session) => format!("s:{session}"),
        None => String::new(),
    }
}

/// How long a task's worker lease lasts unless renewed ([`CursorlogTaskManager::with_worker_lease`]).
pub const DEFAULT_WORKER_LEASE: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Inner {
    conn: Conn,
    worker_lease: Duration,
}

impl Inner {
    async fn tasks<T, F, Fut>(&self, op: Op, f: F) -> Result<T, Status>
    where
        F: FnMut(TasksRaw) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.conn
            .call_with(op, tasks_raw, f)
            .await
            .map(tonic::Response::into_inner)
    }
}

/// The cursorlog-backed task manager; see the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CursorlogTaskManager {
    inner: Arc<Inner>,
}

impl CursorlogTaskManager {
    pub(crate) fn new(conn: Conn) -> Self {
        Self {
            inner: Arc::new(Inner {
                conn,
                worker_lease: DEFAULT_WORKER_LEASE,
            }),
        }
    }

    /// Sets the worker lease: a task whose replica stops renewing it (it died) is failed by
    /// cursorlog after this long. Renewed every third of it while the task runs.
    pub fn with_worker_lease(self, lease: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                conn: self.inner.conn.clone(),
                worker_lease: lease,
            }),
        }
    }

    /// Creates the task durably for `owner` (`CreateTask`), then runs `make_future`'s future
    /// with a [`CursorlogTaskContext`] and records how it ended (`FinishTask`: a result →
    /// completed, [`TaskExit::Cancelled`] → cancelled, [`TaskExit::Error`] → failed). The
    /// returned task is the seed of the `CreateTaskResult`; `tasks/get` on any replica finds
    /// it as soon as this returns.
    ///
    /// # Errors
    /// An internal error (-32603) when cursorlog refuses or cannot be reached; the future is
    /// then never started.
    pub async fn spawn<F>(
        &self,
        owner: &str,
        options: TaskOptions,
        make_future: F,
    ) -> Result<Task, McpError>
    where
        F: FnOnce(CursorlogTaskContext) -> TaskFuture,
    {
        let task_id = uuid::Uuid::new_v4().to_string();
        let request = pb::CreateTaskRequest {
            owner: owner.to_owned(),
            task_id: task_id.clone(),
            request_key: task_id.clone(),
            ttl_ms: options.ttl_ms,
            poll_interval_ms: options.poll_interval_ms,
            worker_lease_ms: Some(millis(self.inner.worker_lease)),
            status_message: options.status_message,
            context: Vec::new(),
        };
        let created = self
            .inner
            .tasks(Op::Idempotent, |mut c| {
                let r = request.clone();
                async move { c.create_task(r).await }
            })
            .await
            .map_err(|s| internal("CreateTask", &s))?;
        let task = created
            .task
            .ok_or_else(|| McpError::internal_error("CreateTask answered no task", None))?;
        context::run(self.inner.clone(), owner, &task, make_future);
        Ok(rmcp_task(&task))
    }

    /// `tasks/get`: the task as cursorlog has it now, on any replica.
    ///
    /// # Errors
    /// -32602 "unknown task" for a task this owner does not have (never created, another
    /// owner's, deleted, or expired); -32603 when cursorlog cannot answer.
    pub async fn get_task(&self, owner: &str, task_id: &str) -> Result<DetailedTask, McpError> {
        let view = self.view(owner, task_id, true).await?;
        detailed(&view)
    }

    async fn view(
        &self,
        owner: &str,
        task_id: &str,
        include_outcome: bool,
    ) -> Result<pb::TaskView, McpError> {
        let request = pb::GetTaskRequest {
            owner: owner.to_owned(),
            task_id: task_id.to_owned(),
            include_outcome,
        };
        let answer = self
            .inner
            .tasks(Op::Read, |mut c| {
                let r = request.clone();
                async move { c.get_task(r).await }
            })
            .await
            .map_err(|s| internal("GetTask", &s))?;
        match (answer.verdict(), answer.view) {
            (pb::TaskVerdict::TaskFound, Some(view)) => Ok(view),
            (pb::TaskVerdict::TaskExpired, _) => Err(McpError::invalid_params(
                format!("unknown task: {task_id} (expired)"),
                None,
            )),
            _ => Err(unknown_task(task_id)),
        }
    }

    /// `tasks/update`: records the answers to the task's outstanding input requests, wherever
    /// the task runs. Keys that are not outstanding are ignored (and acknowledged), as rmcp
    /// does.
    ///
    /// # Errors
    /// -32602 for an unknown task; -32603 when cursorlog cannot answer.
    pub async fn update_task(
        &self,
        owner: &str,
        task_id: &str,
        input_responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), McpError> {
        let view = self.view(owner, task_id, false).await?;
        let outstanding: Vec<&str> = view.outstanding.iter().map(|s| s.key.as_str()).collect();
        let mut responses = HashMap::new();
        for (key, value) in input_responses {
            if !outstanding.contains(&key.as_str()) {
                continue;
            }
            let json = serde_json::to_vec(&value)
                .map_err(|e| McpError::invalid_params(format!("inputResponses: {e}"), None))?;
            responses.insert(key, json);
        }
        if responses.is_empty() {
            return Ok(());
        }
        let request = pb::AnswerInputRequest {
            owner: owner.to_owned(),
            task_id: task_id.to_owned(),
            responses,
        };
        match self
            .inner
            .tasks(Op::Idempotent, |mut c| {
                let r = request.clone();
                async move { c.answer_input(r).await }
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Err(unknown_task(task_id)),
            Err(s) => Err(internal("AnswerInput", &s)),
        }
    }

    /// `tasks/cancel`: records a cooperative cancel request; the task's worker, on whichever
    /// replica, sees it and settles the task. A task that already ended is acknowledged too.
    ///
    /// # Errors
    /// -32602 for an unknown task; -32603 when cursorlog cannot answer.
    pub async fn cancel_task(&self, owner: &str, task_id: &str) -> Result<(), McpError> {
        let request = pb::CancelTaskRequest {
            owner: owner.to_owned(),
            task_id: task_id.to_owned(),
            mode: pb::cancel_task_request::Mode::Request.into(),
            status_message: None,
        };
        match self
            .inner
            .tasks(Op::Idempotent, |mut c| {
                let r = request.clone();
                async move { c.cancel_task(r).await }
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Err(unknown_task(task_id)),
            Err(s) => Err(internal("CancelTask", &s)),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unknown_task(task_id: &str) -> McpError {
    McpError::invalid_params(format!("unknown task: {task_id}"), None)
}

fn internal(call: &str, status: &Status) -> McpError {
    McpError::internal_error(
        format!(
            "cursorlog {call}: {:?}: {}",
            status.code(),
            status.message()
        ),
        None,
    )
}

/// ms since the Unix epoch as ISO 8601 (RFC 3339, UTC).
fn iso(ms: u64) -> String {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn status_of(status: pb::TaskStatus) -> TaskStatus {
    match status {
        pb::TaskStatus::InputRequired => TaskStatus::InputRequired,
        pb::TaskStatus::Completed => TaskStatus::Completed,
        pb::TaskStatus::Failed => TaskStatus::Failed,
        pb::TaskStatus::Cancelled => TaskStatus::Cancelled,
        pb::TaskStatus::Working | pb::TaskStatus::Unspecified => TaskStatus::Working,
    }
}

/// The MCP `Task` of a cursorlog task.
fn rmcp_task(t: &pb::Task) -> Task {
    let mut task = Task::new(
        t.task_id.clone(),
        status_of(t.status()),
        iso(t.created_at_ms),
        iso(t.last_updated_at_ms),
    );
    task.status_message.clone_from(&t.status_message);
    task.ttl_ms = t.ttl_ms;
    task.poll_interval_ms = Some(t.poll_interval_ms);
    task
}

fn json_object(bytes: &[u8]) -> Option<JsonObject> {
    match serde_json::from_slice(bytes) {
        Ok(serde_json::Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// The error object of a task that failed without one (its TTL or its worker's lease).
fn synthetic_error(cause: pb::TaskEndCause) -> JsonObject {
    let message = match cause {
        pb::TaskEndCause::TtlExpired => "task expired: TTL elapsed before completion",
        pb::TaskEndCause::LeaseExpired => "task failed: its worker stopped (lease expired)",
        pb::TaskEndCause::Fenced => "task failed: recovery fenced its writes",
        _ => "task failed",
    };
    let value = serde_json::json!({"code": -32603, "message": message});
    match value {
        serde_json::Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// The `tasks/get` answer for a found task.
fn detailed(view: &pb::TaskView) -> Result<DetailedTask, McpError> {
    let t = view
        .task
        .as_ref()
        .ok_or_else(|| McpError::internal_error("GetTask answered no task", None))?;
    let outcome = view.outcome.as_ref().and_then(|o| json_object(&o.json));
    let payload = match t.status() {
        pb::TaskStatus::InputRequired => {
            let mut input_requests = InputRequests::new();
            for slot in &view.outstanding {
                let request = serde_json::from_slice(&slot.request).map_err(|e| {
                    McpError::internal_error(format!("input request {}: {e}", slot.key), None)
                })?;
                input_requests.insert(slot.key.clone(), request);
            }
            TaskPayload::InputRequired { input_requests }
        }
        pb::TaskStatus::Completed => TaskPayload::Completed {
            result: outcome.unwrap_or_default(),
        },
        pb::TaskStatus::Failed => TaskPayload::Failed {
            error: outcome.unwrap_or_else(|| synthetic_error(t.end_cause())),
        },
        pb::TaskStatus::Cancelled => TaskPayload::Cancelled,
        pb::TaskStatus::Working | pb::TaskStatus::Unspecified => TaskPayload::Working,
    };
    Ok(DetailedTask::new(rmcp_task(t), payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_prefers_authorization_then_session() {
        let mut h = http::HeaderMap::new();
        assert_eq!(owner_of_headers(&h), "");
        h.insert("mcp-session-id", http::HeaderValue::from_static("abc"));
        assert_eq!(owner_of_headers(&h), "s:abc");
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer x"),
        );
        let owner = owner_of_headers(&h);
        assert!(owner.starts_with("a:") && owner.len() == 66, "{owner}");
    }

    #[test]
    fn failed_without_outcome_gets_an_error_object() {
        let view = pb::TaskView {
            task: Some(pb::Task {
                task_id: "t".into(),
                status: pb::TaskStatus::Failed.into(),
                end_cause: pb::TaskEndCause::LeaseExpired.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = detailed(&view).expect("a found task");
        match d.payload {
            TaskPayload::Failed { error } => {
                assert_eq!(error["code"], -32603);
                assert!(error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("lease")));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn times_are_iso8601() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
    }
}
