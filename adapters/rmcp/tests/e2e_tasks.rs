//! Durable MCP Tasks across replicas (issue 20 item 3): one real cursorlog, two demo replicas
//! A and B with `--tasks` (the `CursorlogTaskManager`), and a 2026-07-28 (stateless) MCP
//! client speaking raw JSON-RPC over HTTP, so each request goes to the replica the test names.
//! A task started on A is found, answered and cancelled through B; a task whose replica is
//! killed is failed by its worker lease. The tests wait on cursorlog's `WatchTask`, never on
//! a sleep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::net::SocketAddr;
use std::time::Duration;

use cursorlog_proto::v1::tasks_client::TasksClient;
use harness::{pb, Cluster};
use serde_json::{json, Value};

/// The bound of one wait (a loaded 2-core machine included).
const WAIT: Duration = Duration::from_secs(60);
/// The demo replicas' task worker lease.
const LEASE_MS: &str = "1000";

fn cluster() -> Cluster {
    Cluster::start_with(
        10_000,
        &[],
        &["--tasks", "--task-worker-lease-ms", LEASE_MS],
    )
}

/// One JSON-RPC request on the 2026-07-28 wire to the replica at `addr`: the result, or the
/// error object.
async fn rpc(addr: SocketAddr, method: &str, mut params: Value) -> Result<Value, Value> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "e2e-tasks", "version": "1.0.0"},
        "io.modelcontextprotocol/clientCapabilities": {
            "elicitation": {},
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        }
    });
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut request = reqwest::Client::new()
        .post(format!("http://{addr}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let text = request
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let message: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:").map(str::trim))
        .chain(std::iter::once(text.trim()))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m.get("id") == Some(&json!(1)))
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {text:?}"));
    match message.get("error") {
        Some(error) => Err(error.clone()),
        None => Ok(message["result"].clone()),
    }
}

/// Starts `worker {steps}` on the replica at `addr`; its task id.
async fn start_worker(addr: SocketAddr, steps: u64) -> String {
    let created = rpc(
        addr,
        "tools/call",
        json!({"name": "worker", "arguments": {"steps": steps}}),
    )
    .await
    .unwrap();
    assert_eq!(created["resultType"], "task", "{created}");
    created["taskId"].as_str().unwrap().to_owned()
}

/// Follows the task in cursorlog (owner "": stateless, unauthenticated) until `done` holds.
async fn watch_until(
    cursorlog: SocketAddr,
    task_id: &str,
    done: impl Fn(&pb::TaskView) -> bool,
) -> pb::TaskView {
    let mut client = TasksClient::connect(format!("http://{cursorlog}"))
        .await
        .unwrap();
    let mut stream = client
        .watch_task(pb::WatchTaskRequest {
            owner: String::new(),
            task_id: task_id.to_owned(),
            after_version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(WAIT, async {
        loop {
            let change = stream
                .message()
                .await
                .unwrap()
                .expect("the watch ended before the wanted state");
            let view = change.view.unwrap();
            if done(&view) {
                return view;
            }
        }
    })
    .await
    .expect("the task did not reach the wanted state in time")
}

fn status(view: &pb::TaskView) -> pb::TaskStatus {
    view.task.as_ref().unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_started_on_a_is_found_and_answered_on_b() {
    let cl = cluster();
    let task_id = start_worker(cl.a.addr, 1).await;

    // Durable before CreateTaskResult: B finds it at once.
    let seen = rpc(cl.b.addr, "tasks/get", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(seen["taskId"], task_id.as_str());
    assert!(
        ["working", "input_required"].contains(&seen["status"].as_str().unwrap()),
        "{seen}"
    );

    // A asks for input; B shows the request and takes the answer.
    watch_until(cl.cursorlog.addr, &task_id, |v| {
        status(v) == pb::TaskStatus::InputRequired
    })
    .await;
    let asking = rpc(cl.b.addr, "tasks/get", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(asking["status"], "input_required", "{asking}");
    assert_eq!(asking["statusMessage"], "waiting for step 1", "{asking}");
    assert_eq!(
        asking["inputRequests"]["step-1"]["method"],
        "elicitation/create"
    );
    let ack = rpc(
        cl.b.addr,
        "tasks/update",
        json!({"taskId": task_id, "inputResponses": {
            "step-1": {"action": "accept", "content": {"name": "bob"}},
            "no-such-key": {"action": "decline"}
        }}),
    )
    .await
    .unwrap();
    assert_eq!(ack, json!({"resultType": "complete"}));

    // A's request_input resumed with B's answer, and A finished the task.
    let done = watch_until(cl.cursorlog.addr, &task_id, |v| {
        status(v) == pb::TaskStatus::Completed
    })
    .await;
    assert!(done.task.unwrap().ended_at_ms.is_some());
    let result = rpc(cl.b.addr, "tasks/get", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(
        result["result"]["content"][0]["text"], "worker answers: bob",
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_b_reaches_the_task_running_on_a() {
    let cl = cluster();
    let task_id = start_worker(cl.a.addr, 0).await;
    let ack = rpc(cl.b.addr, "tasks/cancel", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(ack, json!({"resultType": "complete"}));

    // Only A's future ends a REQUEST-mode cancel: CANCELLED means it saw B's cancel.
    let ended = watch_until(cl.cursorlog.addr, &task_id, |v| {
        matches!(
            status(v),
            pb::TaskStatus::Completed | pb::TaskStatus::Failed | pb::TaskStatus::Cancelled
        )
    })
    .await;
    assert_eq!(status(&ended), pb::TaskStatus::Cancelled);
    let on_a = rpc(cl.a.addr, "tasks/get", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(on_a["status"], "cancelled", "{on_a}");

    // Cancelling an ended task is acknowledged the same way, on either replica.
    let again = rpc(cl.b.addr, "tasks/cancel", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(again, json!({"resultType": "complete"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_replica_dies_fails_by_lease_expiry() {
    let mut cl = cluster();
    let task_id = start_worker(cl.a.addr, 0).await;
    cl.a.kill();

    let ended = watch_until(cl.cursorlog.addr, &task_id, |v| {
        status(v) != pb::TaskStatus::Working
    })
    .await;
    assert_eq!(status(&ended), pb::TaskStatus::Failed);
    assert_eq!(
        ended.task.as_ref().unwrap().end_cause(),
        pb::TaskEndCause::LeaseExpired
    );
    let on_b = rpc(cl.b.addr, "tasks/get", json!({"taskId": task_id}))
        .await
        .unwrap();
    assert_eq!(on_b["status"], "failed", "{on_b}");
    assert_eq!(on_b["error"]["code"], -32603, "{on_b}");
    assert!(
        on_b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("lease")),
        "{on_b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_task_is_invalid_params_on_every_method() {
    let cl = cluster();
    for method in ["tasks/get", "tasks/cancel", "tasks/update"] {
        let error = rpc(
            cl.b.addr,
            method,
            json!({"taskId": "no-such-task", "inputResponses": {"k": {}}}),
        )
        .await
        .unwrap_err();
        assert_eq!(error["code"], -32602, "{method}: {error}");
    }
}
