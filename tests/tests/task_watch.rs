//! `WatchTask` and `KeepAliveTask` against the real binary: the replica running a task
//! learns of an answer written through another connection, the watch ends after the task's
//! end, and a task whose worker stops renewing its lease is failed by the server rather than
//! left `WORKING` (observed through the watch: no sleeps).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use cursorlog_tests::{pb, Server};
use pb::tasks_client::TasksClient;
use tonic::transport::Channel;
use tonic::Code;

type Client = TasksClient<Channel>;

async fn client(server: &Server) -> Client {
    TasksClient::new(server.channel().await)
}

fn create(task_id: &str, worker_lease_ms: Option<u64>) -> pb::CreateTaskRequest {
    pb::CreateTaskRequest {
        owner: "s:a".into(),
        task_id: task_id.into(),
        request_key: format!("r-{task_id}"),
        worker_lease_ms,
        ..Default::default()
    }
}

fn watch(task_id: &str, after_version: u64) -> pb::WatchTaskRequest {
    pb::WatchTaskRequest {
        owner: "s:a".into(),
        task_id: task_id.into(),
        after_version,
    }
}

/// The next message of a watch, within a deadline that only a hang reaches.
async fn next(stream: &mut tonic::Streaming<pb::GetTaskResponse>) -> Option<pb::GetTaskResponse> {
    tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .expect("the watch answered")
        .unwrap()
}

fn task(m: &pb::GetTaskResponse) -> pb::Task {
    m.view.clone().unwrap().task.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sees_an_answer_written_through_another_connection_then_the_end() {
    let server = Server::start(&[]);
    let mut worker = client(&server).await;
    let mut elsewhere = client(&server).await;
    worker.create_task(create("t1", None)).await.unwrap();
    worker
        .request_input(pb::RequestInputRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            requests: [("confirm".to_owned(), b"{}".to_vec())].into(),
            status_message: None,
        })
        .await
        .unwrap();
    let mut changes = worker
        .watch_task(watch("t1", 0))
        .await
        .unwrap()
        .into_inner();
    let first = next(&mut changes).await.unwrap();
    assert_eq!(first.verdict(), pb::TaskVerdict::TaskFound);
    assert_eq!(task(&first).version, 2);
    assert_eq!(first.view.as_ref().unwrap().outstanding.len(), 1);
    elsewhere
        .answer_input(pb::AnswerInputRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            responses: [("confirm".to_owned(), b"{\"action\":\"accept\"}".to_vec())].into(),
        })
        .await
        .unwrap();
    let answered = next(&mut changes).await.unwrap();
    assert_eq!(task(&answered).version, 3);
    let slot = &answered.view.as_ref().unwrap().answered[0];
    assert_eq!(slot.key, "confirm");
    assert_eq!(
        slot.response.as_deref(),
        Some(&b"{\"action\":\"accept\"}"[..]),
        "the running replica reads the answer another connection gave"
    );
    assert_eq!(task(&answered).status(), pb::TaskStatus::Working);
    elsewhere
        .finish_task(pb::FinishTaskRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            status: pb::TaskStatus::Completed.into(),
            outcome: Some(pb::TaskOutcome {
                kind: pb::task_outcome::Kind::Result.into(),
                json: b"{\"content\":[]}".to_vec(),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let end = next(&mut changes).await.unwrap();
    assert_eq!(task(&end).status(), pb::TaskStatus::Completed);
    assert_eq!(
        end.view.unwrap().outcome.unwrap().json,
        b"{\"content\":[]}".to_vec()
    );
    assert!(
        next(&mut changes).await.is_none(),
        "the watch ends after the end"
    );
    // Watching again from the end's version ends at once.
    let mut again = worker
        .watch_task(watch("t1", 4))
        .await
        .unwrap()
        .into_inner();
    assert!(next(&mut again).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_worker_stops_renewing_is_failed_by_the_server() {
    let server = Server::start(&[]);
    let mut c = client(&server).await;
    c.create_task(create("t1", Some(300))).await.unwrap();
    // A renewal is taken while it runs.
    c.keep_alive_task(pb::KeepAliveTaskRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
    })
    .await
    .unwrap();
    // Then no more: the server fails it; the watch shows it (waiting for the event).
    let mut changes = c.watch_task(watch("t1", 1)).await.unwrap().into_inner();
    let end = next(&mut changes).await.unwrap();
    let failed = task(&end);
    assert_eq!(failed.status(), pb::TaskStatus::Failed);
    assert!(
        failed.status_message().contains("lease"),
        "{:?}",
        failed.status_message
    );
    let refused = c
        .keep_alive_task(pb::KeepAliveTaskRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let unknown = c
        .keep_alive_task(pb::KeepAliveTaskRequest {
            owner: "s:b".into(),
            task_id: "t1".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let no_watch = c.watch_task(pb::WatchTaskRequest {
        owner: "s:b".into(),
        task_id: "t1".into(),
        after_version: 0,
    });
    assert_eq!(no_watch.await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_is_fifo_bounded_and_safe_to_retry_over_grpc() {
    let server = Server::start(&[]);
    let mut a = client(&server).await;
    let mut b = client(&server).await;
    a.create_task(create("t1", None)).await.unwrap();
    let enqueue = |text: &str| pb::EnqueueTaskMessageRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
        channel: 0,
        message: text.as_bytes().to_vec(),
        max_len: 2,
        dedupe_key: Some(format!("d-{text}")),
        correlation: None,
    };
    assert_eq!(
        a.enqueue_task_message(enqueue("one"))
            .await
            .unwrap()
            .into_inner()
            .qseq,
        1
    );
    let retried = a
        .enqueue_task_message(enqueue("one"))
        .await
        .unwrap()
        .into_inner();
    assert!(retried.duplicate);
    a.enqueue_task_message(enqueue("two")).await.unwrap();
    let full = a.enqueue_task_message(enqueue("three")).await.unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    let dequeue = |token: &str| pb::DequeueTaskMessagesRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
        channel: 0,
        max_messages: 0,
        token: token.into(),
    };
    // Another connection (another replica) takes them, in order, once.
    let taken = b
        .dequeue_task_messages(dequeue("tok"))
        .await
        .unwrap()
        .into_inner();
    let texts: Vec<_> = taken.messages.iter().map(|m| m.message.clone()).collect();
    assert_eq!(texts, [b"one".to_vec(), b"two".to_vec()]);
    let again = b
        .dequeue_task_messages(dequeue("tok"))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    assert_eq!(again.messages, taken.messages);
    let empty = b
        .dequeue_task_messages(dequeue("tok2"))
        .await
        .unwrap()
        .into_inner();
    assert!(empty.messages.is_empty());
    let mut bad = enqueue("x");
    bad.channel = 5;
    assert_eq!(
        a.enqueue_task_message(bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// Watches share the `--read-calls-max` slots with `Read`: one watch over the limit is
/// refused at once, naming the flag, and the slot of a watch that ended is free again by the
/// time its client sees the end (no retry loop needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_take_read_slots_and_free_them_when_they_end() {
    let server = Server::start(&["--read-calls-max", "2"]);
    let mut c = client(&server).await;
    for id in ["w1", "w2", "w3"] {
        c.create_task(create(id, None)).await.unwrap();
    }
    let mut first = c.watch_task(watch("w1", 0)).await.unwrap().into_inner();
    let _second = c.watch_task(watch("w2", 0)).await.unwrap().into_inner();
    let refused = c.watch_task(watch("w3", 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--read-calls-max"),
        "{refused:?}"
    );

    c.finish_task(pb::FinishTaskRequest {
        owner: "s:a".into(),
        task_id: "w1".into(),
        status: pb::TaskStatus::Failed.into(),
        outcome: Some(pb::TaskOutcome {
            kind: pb::task_outcome::Kind::Error.into(),
            json: b"{\"code\":-1,\"message\":\"x\"}".to_vec(),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    while next(&mut first).await.is_some() {}
    let mut third = c.watch_task(watch("w3", 0)).await.unwrap().into_inner();
    assert_eq!(task(&next(&mut third).await.unwrap()).task_id, "w3");
}
