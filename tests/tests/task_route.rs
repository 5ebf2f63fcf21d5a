//! `RouteTaskMessage` against the real binary (issue 20, docs/TASKS-DESIGN.md §1.6, the
//! inbound channel): the replica running a task enqueues an elicitation request with its
//! JSON-RPC id; the client's answer, received through another connection (another replica),
//! is routed to the task's inbound queue once; the running replica's watch sees it and its
//! dequeue takes it; a retry is `duplicate` with the same qseq, on a cluster across a
//! failover too.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{free_addr, pb, start_member, Server};
use pb::tasks_client::TasksClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

type Client = TasksClient<Channel>;

const WAIT: Duration = Duration::from_secs(90);

fn create(task_id: &str) -> pb::CreateTaskRequest {
    pb::CreateTaskRequest {
        owner: "s:a".into(),
        task_id: task_id.into(),
        request_key: format!("r-{task_id}"),
        ..Default::default()
    }
}

/// The worker's SDK enqueues an elicitation request with JSON-RPC id `id`.
fn ask(task_id: &str, id: &str) -> pb::EnqueueTaskMessageRequest {
    pb::EnqueueTaskMessageRequest {
        owner: "s:a".into(),
        task_id: task_id.into(),
        channel: 0,
        message: format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"elicitation/create"}}"#)
            .into_bytes(),
        max_len: 0,
        dedupe_key: None,
        correlation: Some(id.into()),
    }
}

fn answer(owner: &str, id: &str) -> pb::RouteTaskMessageRequest {
    pb::RouteTaskMessageRequest {
        owner: owner.into(),
        correlation: id.into(),
        message: format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"action":"accept"}}}}"#)
            .into_bytes(),
    }
}

fn routed(task_id: &str, qseq: u64, duplicate: bool) -> pb::RouteTaskMessageResponse {
    pb::RouteTaskMessageResponse {
        routed: true,
        task_id: task_id.into(),
        qseq,
        duplicate,
    }
}

fn take_inbound(task_id: &str, token: &str) -> pb::DequeueTaskMessagesRequest {
    pb::DequeueTaskMessagesRequest {
        owner: "s:a".into(),
        task_id: task_id.into(),
        channel: 1,
        max_messages: 0,
        token: token.into(),
    }
}

/// The correlations of the messages taken.
fn correlations(d: &pb::DequeueTaskMessagesResponse) -> Vec<String> {
    d.messages
        .iter()
        .map(|m| m.correlation.clone().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_through_another_connection_reaches_the_watching_worker_once() {
    let server = Server::start(&[]);
    let mut worker = TasksClient::new(server.channel().await);
    let mut other = TasksClient::new(server.channel().await);
    worker.create_task(create("t")).await.unwrap();
    worker.enqueue_task_message(ask("t", "7")).await.unwrap();
    let mut watch = worker
        .watch_task(pb::WatchTaskRequest {
            owner: "s:a".into(),
            task_id: "t".into(),
            after_version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.view.unwrap().inbound_queued, 0);
    let got = other
        .route_task_message(answer("s:a", "7"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, routed("t", 1, false));
    let seen = tokio::time::timeout(Duration::from_secs(60), watch.message())
        .await
        .expect("the routed answer woke the watch")
        .unwrap()
        .unwrap();
    assert_eq!(seen.view.unwrap().inbound_queued, 1);
    let taken = worker
        .dequeue_task_messages(take_inbound("t", "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(correlations(&taken), ["7"]);
    assert!(String::from_utf8(taken.messages[0].message.clone())
        .unwrap()
        .contains("accept"));
    // A retry after an unknown outcome: the same task and qseq, nothing routed again.
    let again = other
        .route_task_message(answer("s:a", "7"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, routed("t", 1, true));
    let none = worker
        .dequeue_task_messages(take_inbound("t", "k2"))
        .await
        .unwrap()
        .into_inner();
    assert!(none.messages.is_empty(), "routed once");
    // No route: never asked, or another owner's correlation.
    for (owner, id) in [("s:a", "8"), ("s:b", "7"), ("", "7")] {
        let r = other
            .route_task_message(answer(owner, id))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r, pb::RouteTaskMessageResponse::default(), "{owner} {id}");
    }
    // Bad input names its field.
    for bad in [String::new(), "x".repeat(257)] {
        let status = other
            .route_task_message(pb::RouteTaskMessageRequest {
                owner: "s:a".into(),
                correlation: bad,
                message: b"{}".to_vec(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("correlation"), "{status:?}");
    }
}

/// Runs `call` on whichever live member leads (the last leader first), every 100 ms up to
/// [`WAIT`], until one answers with anything but UNAVAILABLE or a transport error.
async fn on_leader<T, F, Fut>(
    clients: &[Client],
    alive: &[bool],
    leader: &mut usize,
    mut call: F,
) -> Result<T, Status>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        for k in 0..clients.len() {
            let i = (*leader + k) % clients.len();
            if !alive[i] {
                continue;
            }
            match call(clients[i].clone()).await {
                Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown) => {}
                other => {
                    *leader = i;
                    return other;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader answered within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_are_replicated_a_retry_on_the_next_leader_is_a_duplicate() {
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<Server> = (0..3)
        .map(|i| start_member(i + 1, &addrs, dirs[i].path(), &[]))
        .collect();
    let mut clients = Vec::new();
    for node in &nodes {
        clients.push(TasksClient::new(node.channel().await));
    }
    let mut alive = vec![true; 3];
    let mut leader = 0;
    on_leader(&clients, &alive, &mut leader, |mut c| async move {
        c.create_task(create("t")).await
    })
    .await
    .unwrap();
    for id in ["7", "8"] {
        on_leader(&clients, &alive, &mut leader, |mut c| async move {
            c.enqueue_task_message(ask("t", id)).await
        })
        .await
        .unwrap();
    }
    let first = on_leader(&clients, &alive, &mut leader, |mut c| async move {
        c.route_task_message(answer("s:a", "7")).await
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(first, routed("t", 1, false));
    // The leader dies; the next one holds both routes as the log left them.
    nodes[leader].kill();
    alive[leader] = false;
    let retry = on_leader(&clients, &alive, &mut leader, |mut c| async move {
        c.route_task_message(answer("s:a", "7")).await
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(
        retry,
        routed("t", 1, true),
        "answered once, across the failover"
    );
    let second = on_leader(&clients, &alive, &mut leader, |mut c| async move {
        c.route_task_message(answer("s:a", "8")).await
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(second, routed("t", 2, false));
    let taken = on_leader(&clients, &alive, &mut leader, |mut c| async move {
        c.dequeue_task_messages(take_inbound("t", "k")).await
    })
    .await
    .unwrap()
    .into_inner();
    assert_eq!(correlations(&taken), ["7", "8"]);
}
