//! The demo replica's tasks mode (`--tasks`): the fixture tools of the MCP conformance suite's
//! `tasks-*` scenarios (0.2.0-alpha.12), run as durable tasks by
//! [`CursorlogTaskManager`], so `tasks/get`, `tasks/update` and `tasks/cancel` work on any
//! replica.
//!
//! - `greet {name}`: sync only, "Hello, {name}!".
//! - `slow_compute {seconds, label}`: a task that sleeps, then returns; settles `cancelled`
//!   on `tasks/cancel`.
//! - `failing_job`: task support *required*; a tool error (`isError`) after a short while.
//! - `protocol_error_job`: a task that fails with a JSON-RPC error.
//! - `confirm_delete {filename}`: a task that asks for one elicitation.
//! - `multi_input`: a task that asks for two elicitations at once.
//! - `test_tool_with_task`: task support *required*; an MRTR round asking for `user_name`,
//!   then a task whose result names it.
//! - `worker {steps}`: a task that waits for `steps` answers or a cancel (for the tests).

use std::time::Duration;

use cursorlog_rmcp::tasks::{owner_of, CursorlogTaskContext, CursorlogTaskManager, TaskExit};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ContentBlock, CreateTaskResult, ErrorData, GetTaskParams, GetTaskResult, InputRequest,
    InputRequests, InputRequiredResult, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::TaskOptions;
use rmcp::RoleServer;
use serde_json::{json, Value};

/// The fixture tools.
pub fn tools() -> Vec<Tool> {
    let tool = |name: &'static str, description: &'static str, schema: Value| {
        let Value::Object(schema) = schema else {
            unreachable!("every schema below is an object literal")
        };
        Tool::new(name, description, std::sync::Arc::new(schema))
    };
    let object = |props: Value| json!({"type": "object", "properties": props});
    vec![
        tool(
            "greet",
            "Returns Hello, {name}!",
            object(json!({"name": {"type": "string"}})),
        ),
        tool(
            "slow_compute",
            "Task: sleeps `seconds`, then returns",
            object(json!({"seconds": {"type": "number"}, "label": {"type": "string"}})),
        ),
        tool(
            "failing_job",
            "Task (required): a tool error",
            object(json!({})),
        ),
        tool(
            "protocol_error_job",
            "Task: fails with a JSON-RPC error",
            object(json!({})),
        ),
        tool(
            "confirm_delete",
            "Task: asks to confirm, then deletes",
            object(json!({"filename": {"type": "string"}})),
        ),
        tool(
            "multi_input",
            "Task: asks two questions at once",
            object(json!({})),
        ),
        tool(
            "test_tool_with_task",
            "Task (required): MRTR for user_name, then a task",
            object(json!({})),
        ),
        tool(
            "worker",
            "Task: waits for `steps` answers or a cancel",
            object(json!({"steps": {"type": "integer"}})),
        ),
    ]
}

/// Whether `name` is one of the fixtures.
pub fn is_fixture(name: &str) -> bool {
    tools().iter().any(|t| t.name == name)
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn elicit(message: &str) -> Result<InputRequest, ErrorData> {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "confirm": {"type": "boolean"},
                    "name": {"type": "string"}
                }
            }
        }
    }))
    .map_err(|e| ErrorData::internal_error(format!("elicitation: {e}"), None))
}

fn arg_f64(request: &CallToolRequestParams, name: &str) -> f64 {
    request
        .arguments
        .as_ref()
        .and_then(|a| a.get(name))
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

fn arg_str(request: &CallToolRequestParams, name: &str, default: &str) -> String {
    request
        .arguments
        .as_ref()
        .and_then(|a| a.get(name))
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_owned()
}

/// Answers `tools/call` for a fixture.
pub async fn call_tool(
    tasks: &CursorlogTaskManager,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let name = request.name.to_string();
    if name == "greet" {
        let who = arg_str(&request, "name", "World");
        return Ok(text(format!("Hello, {who}!")).into());
    }
    let declared = context
        .client_capabilities()
        .is_some_and(|caps| caps.supports_tasks());
    if !declared {
        if matches!(name.as_str(), "failing_job" | "test_tool_with_task") {
            return Err(ErrorData::missing_required_client_capability(
                ClientCapabilities::builder().enable_tasks().build(),
            ));
        }
        // Task support "optional": a client without the extension gets the result inline.
        if name == "slow_compute" {
            let seconds = arg_f64(&request, "seconds");
            tokio::time::sleep(Duration::from_secs_f64(seconds.clamp(0.0, 60.0))).await;
            let label = arg_str(&request, "label", "slow_compute");
            return Ok(text(format!("{label}: done after {seconds}s")).into());
        }
        return Err(ErrorData::missing_required_client_capability(
            ClientCapabilities::builder().enable_tasks().build(),
        ));
    }
    let owner = owner_of(&context);
    let options = TaskOptions::new().with_poll_interval_ms(200);
    let task = match name.as_str() {
        "slow_compute" => {
            let seconds = arg_f64(&request, "seconds").clamp(0.0, 600.0);
            let label = arg_str(&request, "label", "slow_compute");
            tasks
                .spawn(&owner, options, move |ctx| {
                    Box::pin(async move {
                        tokio::select! {
                            () = ctx.cancelled() => Err(TaskExit::Cancelled),
                            () = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {
                                Ok(text(format!("{label}: done after {seconds}s")))
                            }
                        }
                    })
                })
                .await?
        }
        "failing_job" => {
            tasks
                .spawn(&owner, options, |_ctx| {
                    Box::pin(async move {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok(CallToolResult::error(vec![ContentBlock::text(
                            "failing_job: the job failed",
                        )]))
                    })
                })
                .await?
        }
        "protocol_error_job" => {
            tasks
                .spawn(&owner, options, |_ctx| {
                    Box::pin(async move {
                        Err(TaskExit::Error(ErrorData::internal_error(
                            "protocol_error_job: internal failure",
                            None,
                        )))
                    })
                })
                .await?
        }
        "confirm_delete" => {
            let filename = arg_str(&request, "filename", "file.txt");
            tasks
                .spawn(&owner, options, move |ctx| {
                    Box::pin(async move { confirm_delete(ctx, filename).await })
                })
                .await?
        }
        "multi_input" => {
            tasks
                .spawn(&owner, options, |ctx| Box::pin(multi_input(ctx)))
                .await?
        }
        "test_tool_with_task" => return mrtr_then_task(tasks, &owner, request).await,
        "worker" => {
            let steps = arg_f64(&request, "steps").max(0.0) as u32;
            tasks
                .spawn(&owner, options, move |ctx| Box::pin(worker(ctx, steps)))
                .await?
        }
        other => {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {other}"),
                None,
            ))
        }
    };
    Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
}

async fn confirm_delete(
    ctx: CursorlogTaskContext,
    filename: String,
) -> Result<CallToolResult, TaskExit> {
    let answer = ctx
        .request_input("confirm", elicit(&format!("Delete {filename}?"))?)
        .await?;
    let confirmed = answer["action"] == "accept" && answer["content"]["confirm"] != false;
    Ok(text(if confirmed {
        format!("Deleted {filename}")
    } else {
        format!("Kept {filename}")
    }))
}

async fn multi_input(ctx: CursorlogTaskContext) -> Result<CallToolResult, TaskExit> {
    let (a, b) = tokio::join!(
        ctx.request_input("first", elicit("First question")?),
        ctx.request_input("second", elicit("Second question")?),
    );
    let (a, b) = (a?, b?);
    Ok(text(format!(
        "answers: {} and {}",
        a["content"]["name"], b["content"]["name"]
    )))
}

/// Waits for `steps` answers in turn (keys `step-1`…, each announced in the status message),
/// or a cancel; returns the answers.
async fn worker(ctx: CursorlogTaskContext, steps: u32) -> Result<CallToolResult, TaskExit> {
    let mut answers = Vec::new();
    for step in 1..=steps {
        ctx.set_status_message(format!("waiting for step {step}"))
            .await?;
        let answer = ctx
            .request_input(format!("step-{step}"), elicit(&format!("step {step}"))?)
            .await?;
        answers.push(answer["content"]["name"].as_str().unwrap_or("?").to_owned());
    }
    if steps == 0 {
        ctx.cancelled().await;
        return Err(TaskExit::Cancelled);
    }
    Ok(text(format!("worker answers: {}", answers.join(","))))
}

/// `test_tool_with_task`: round 1 asks for `user_name` (SEP-2322 MRTR, synchronously);
/// round 2 carries the answer and becomes a task whose result names the user.
async fn mrtr_then_task(
    tasks: &CursorlogTaskManager,
    owner: &str,
    request: CallToolRequestParams,
) -> Result<CallToolResponse, ErrorData> {
    let answer = request
        .input_responses
        .as_ref()
        .and_then(|r| r.get("user_name").cloned());
    let Some(answer) = answer else {
        let mut asks = InputRequests::new();
        asks.insert("user_name".into(), elicit("What is your name?")?);
        return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(asks),
            None,
        )));
    };
    let user = answer["content"]["name"]
        .as_str()
        .or_else(|| answer["content"]["user_name"].as_str())
        .unwrap_or("unknown")
        .to_owned();
    let task = tasks
        .spawn(
            owner,
            TaskOptions::new().with_poll_interval_ms(200),
            move |_ctx| Box::pin(async move { Ok(text(format!("Hello, {user}!"))) }),
        )
        .await?;
    Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
}

/// `tasks/get` through the cursorlog task manager.
pub async fn get_task(
    tasks: &CursorlogTaskManager,
    request: GetTaskParams,
    context: RequestContext<RoleServer>,
) -> Result<GetTaskResult, ErrorData> {
    let task = tasks
        .get_task(&owner_of(&context), &request.task_id)
        .await?;
    Ok(GetTaskResult::new(task))
}

/// `tasks/update` through the cursorlog task manager.
pub async fn update_task(
    tasks: &CursorlogTaskManager,
    request: UpdateTaskParams,
    context: RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    tasks
        .update_task(
            &owner_of(&context),
            &request.task_id,
            request.input_responses,
        )
        .await
}

/// `tasks/cancel` through the cursorlog task manager.
pub async fn cancel_task(
    tasks: &CursorlogTaskManager,
    request: CancelTaskParams,
    context: RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    tasks
        .cancel_task(&owner_of(&context), &request.task_id)
        .await
}
