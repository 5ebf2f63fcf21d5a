//! `Tasks.TaskStream` (issue 31 item 3) against the real binary: many task calls pipelined on
//! one stream, each answered by its id with exactly what its unary RPC answers (responses and
//! failures alike), a failed call answering only its own request, calls on one task applied
//! in request order, and the stream ending UNAVAILABLE when the server shuts down.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use cursorlog_tests::{pb, Server};
use pb::task_stream_request::Call as Q;
use pb::task_stream_response::Result as A;
use pb::tasks_client::TasksClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const TIMEOUT: Duration = Duration::from_secs(60);

type Client = TasksClient<Channel>;

/// What a call answered, comparable across owners and runs: times zeroed, failures as
/// (code, message).
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok(Box<A>),
    Failed(i32, String),
}

fn zero_times(task: Option<&mut pb::Task>) {
    if let Some(t) = task {
        t.created_at_ms = 0;
        t.last_updated_at_ms = 0;
        t.ended_at_ms = t.ended_at_ms.map(|_| 0);
    }
}

fn normal(mut answer: A) -> Outcome {
    match &mut answer {
        A::CreateTask(r) => zero_times(r.task.as_mut()),
        A::UpdateTask(r) => zero_times(r.task.as_mut()),
        A::FinishTask(r) => zero_times(r.task.as_mut()),
        A::GetTask(r) => zero_times(r.view.as_mut().and_then(|v| v.task.as_mut())),
        A::Failure(f) => return Outcome::Failed(f.code, f.message.clone()),
        _ => {}
    }
    Outcome::Ok(Box::new(answer))
}

fn failed(status: &Status) -> Outcome {
    Outcome::Failed(status.code() as i32, status.message().to_owned())
}

/// The calls of task `i` of `owner`: create, update, get, finish, get with the outcome, and
/// an update of the ended task (FAILED_PRECONDITION); task 3 also gets a create of its id
/// under another request key (ALREADY_EXISTS) and an invalid create (INVALID_ARGUMENT).
fn calls(owner: &str, i: usize) -> Vec<Q> {
    let task_id = format!("t{i}");
    let create = |key: &str, task_id: &str| pb::CreateTaskRequest {
        owner: owner.into(),
        task_id: task_id.into(),
        request_key: key.into(),
        status_message: Some("started".into()),
        context: format!("{{\"task\":{i}}}").into_bytes(),
        ..Default::default()
    };
    let get = |include_outcome| pb::GetTaskRequest {
        owner: owner.into(),
        task_id: task_id.clone(),
        include_outcome,
    };
    let update = |status: pb::TaskStatus, message: &str| pb::UpdateTaskRequest {
        owner: owner.into(),
        task_id: task_id.clone(),
        status: status.into(),
        status_message: Some(message.into()),
        ..Default::default()
    };
    let mut calls = vec![
        Q::CreateTask(create(&format!("k{i}"), &task_id)),
        Q::UpdateTask(update(pb::TaskStatus::InputRequired, "waiting")),
        Q::GetTask(get(false)),
        Q::FinishTask(pb::FinishTaskRequest {
            owner: owner.into(),
            task_id: task_id.clone(),
            status: pb::TaskStatus::Completed.into(),
            outcome: Some(pb::TaskOutcome {
                kind: pb::task_outcome::Kind::Result.into(),
                json: format!("{{\"done\":{i}}}").into_bytes(),
            }),
            ..Default::default()
        }),
        Q::GetTask(get(true)),
        Q::UpdateTask(update(pb::TaskStatus::Working, "too late")),
    ];
    if i == 3 {
        calls.push(Q::CreateTask(create("another key", &task_id)));
        calls.push(Q::CreateTask(create("k-empty", "")));
        calls.push(Q::UpdateTask(pb::UpdateTaskRequest {
            task_id: "never created".into(),
            ..update(pb::TaskStatus::Working, "")
        }));
    }
    calls
}

/// `call` through its unary RPC.
async fn unary(c: &mut Client, call: Q) -> Outcome {
    let answer = match call {
        Q::CreateTask(r) => c
            .create_task(r)
            .await
            .map(|r| A::CreateTask(r.into_inner())),
        Q::GetTask(r) => c.get_task(r).await.map(|r| A::GetTask(r.into_inner())),
        Q::UpdateTask(r) => c
            .update_task(r)
            .await
            .map(|r| A::UpdateTask(r.into_inner())),
        Q::FinishTask(r) => c
            .finish_task(r)
            .await
            .map(|r| A::FinishTask(r.into_inner())),
        other => panic!("not used here: {other:?}"),
    };
    match answer {
        Ok(a) => normal(a),
        Err(status) => failed(&status),
    }
}

#[tokio::test]
async fn pipelined_calls_are_answered_by_id_as_their_unary_calls_answer() {
    const TASKS: usize = 40;
    let server = Server::start(&[]);
    let mut c = TasksClient::new(server.channel().await);

    // The same calls, unary and one after another, under another owner (the messages never
    // name the owner).
    let mut expected = Vec::new();
    for i in 0..TASKS {
        for call in calls("unary", i) {
            expected.push(unary(&mut c, call).await);
        }
    }

    // All of them on one stream, sent before any answer is read, tasks interleaved: the
    // calls of one task keep their order, and a request without a call fails only itself.
    let mut requests: Vec<(u64, Q)> = Vec::new();
    let per_task: Vec<Vec<Q>> = (0..TASKS).map(|i| calls("stream", i)).collect();
    let mut next_id = 1_000_u64;
    // Round-robin over the tasks: call k of every task, then call k + 1 of every task.
    let longest = per_task.iter().map(Vec::len).max().unwrap();
    let mut order = Vec::new();
    for k in 0..longest {
        for (i, task_calls) in per_task.iter().enumerate() {
            if let Some(call) = task_calls.get(k) {
                order.push((i, k));
                requests.push((next_id, call.clone()));
                next_id += 7;
            }
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel(requests.len() + 1);
    for (id, call) in &requests {
        tx.send(pb::TaskStreamRequest {
            id: *id,
            call: Some(call.clone()),
        })
        .await
        .unwrap();
    }
    tx.send(pb::TaskStreamRequest { id: 5, call: None })
        .await
        .unwrap();
    drop(tx);
    let mut answers = c
        .task_stream(Request::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
        .await
        .unwrap()
        .into_inner();
    let mut got: HashMap<u64, A> = HashMap::new();
    while let Some(answer) = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .expect("answers keep coming")
        .unwrap()
    {
        let previous = got.insert(answer.id, answer.result.expect("every answer has a result"));
        assert!(previous.is_none(), "id {} answered twice", answer.id);
    }
    assert_eq!(got.len(), requests.len() + 1, "every request answered once");

    match got.remove(&5).unwrap() {
        A::Failure(f) => {
            assert_eq!(f.code, Code::InvalidArgument as i32, "{f:?}");
            assert!(f.message.contains("call is required"), "{f:?}");
        }
        other => panic!("a request without a call answered {other:?}"),
    }
    // Each stream call answered what the same unary call answered.
    let mut offsets = vec![0_usize; TASKS];
    let mut start = 0;
    for (i, task_calls) in per_task.iter().enumerate() {
        offsets[i] = start;
        start += task_calls.len();
    }
    let mut failures = 0;
    for ((id, _), (i, k)) in requests.iter().zip(&order) {
        let outcome = normal(got.remove(id).unwrap());
        if matches!(outcome, Outcome::Failed(..)) {
            failures += 1;
        }
        assert_eq!(
            outcome,
            expected[offsets[*i] + k],
            "task {i} call {k} (id {id})"
        );
    }
    // One FAILED_PRECONDITION per task, plus ALREADY_EXISTS, INVALID_ARGUMENT, NOT_FOUND.
    assert_eq!(failures, TASKS + 3);
}

#[tokio::test]
async fn the_stream_ends_unavailable_when_the_server_shuts_down() {
    let mut server = Server::start(&[]);
    let mut c = TasksClient::new(server.channel().await);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = c
        .task_stream(Request::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::TaskStreamRequest {
        id: 1,
        call: Some(Q::GetTask(pb::GetTaskRequest {
            owner: "o".into(),
            task_id: "unknown".into(),
            include_outcome: false,
        })),
    })
    .await
    .unwrap();
    let first = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.id, 1);
    match first.result.unwrap() {
        A::GetTask(r) => assert_eq!(r.verdict, pb::TaskVerdict::TaskUnknown as i32),
        other => panic!("GetTask answered {other:?}"),
    }
    // The stream stays open (tx is held); SIGTERM ends it.
    let stopping = tokio::task::spawn_blocking(move || {
        server.terminate();
        server
    });
    let end = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .expect("the stream ends on shutdown");
    let status = end.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shutting down"), "{status:?}");
    drop(tx);
    drop(stopping.await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_follower_the_stream_ends_unavailable_naming_the_leader_and_safe_to_resend() {
    let cluster = cursorlog_tests::cluster::Cluster::start(&[]).await;
    let leader = cluster.leader(None).await;
    cluster.wait_caught_up(leader).await;
    let create = |id: u64| pb::TaskStreamRequest {
        id,
        call: Some(Q::CreateTask(pb::CreateTaskRequest {
            owner: "o".into(),
            task_id: "t".into(),
            request_key: "k".into(),
            ..Default::default()
        })),
    };
    for follower in (0..3).filter(|i| *i != leader) {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(create(1)).await.unwrap();
        let mut answers = cluster
            .tasks(follower)
            .task_stream(Request::new(tokio_stream::wrappers::ReceiverStream::new(
                rx,
            )))
            .await
            .unwrap()
            .into_inner();
        // The call was never read: no answer, only the end.
        let end = tokio::time::timeout(TIMEOUT, answers.message())
            .await
            .expect("a follower ends the stream");
        let status = end.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            cursorlog_tests::cluster::retry_is_safe(&status),
            "{status:?}"
        );
        if let Some(named) = status.metadata().get("cursorlog-leader") {
            assert_eq!(named.to_str().unwrap(), cluster.addrs[leader], "{status:?}");
        }
        drop(tx);
    }
    // The leader serves it: the create, then a get of the task on the same stream.
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(create(1)).await.unwrap();
    tx.send(pb::TaskStreamRequest {
        id: 2,
        call: Some(Q::GetTask(pb::GetTaskRequest {
            owner: "o".into(),
            task_id: "t".into(),
            include_outcome: false,
        })),
    })
    .await
    .unwrap();
    drop(tx);
    let mut answers = cluster
        .tasks(leader)
        .task_stream(Request::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
        .await
        .unwrap()
        .into_inner();
    let mut got = HashMap::new();
    while let Some(a) = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .unwrap()
        .unwrap()
    {
        got.insert(a.id, a.result.unwrap());
    }
    assert!(
        matches!(got.get(&1), Some(A::CreateTask(r)) if r.created),
        "{got:?}"
    );
    assert!(
        matches!(got.get(&2), Some(A::GetTask(r)) if r.verdict == pb::TaskVerdict::TaskFound as i32),
        "{got:?}"
    );
}
