//! `cursorlog.v1.Tasks` (durable MCP tasks, issue 20) against the real binary over real gRPC:
//! the whole lifecycle of a task, idempotent creates, owners that never see each other's
//! tasks, exactly one winner of two racing ends, deletion verdicts, the per-owner cap naming
//! its flag, paging and bad cursors, a task that survives `kill -9`, the same token, health
//! and reflection as the event log (the cluster cases are in `cluster_tasks.rs`).

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use cursorlog_tests::{pb, Server};
use pb::tasks_client::TasksClient;
use tonic::transport::Channel;
use tonic::Code;

type Client = TasksClient<Channel>;

async fn client(server: &Server) -> Client {
    TasksClient::new(server.channel().await)
}

fn create(owner: &str, task_id: &str, request_key: &str) -> pb::CreateTaskRequest {
    pb::CreateTaskRequest {
        owner: owner.into(),
        task_id: task_id.into(),
        request_key: request_key.into(),
        status_message: Some("started".into()),
        context: b"{\"tool\":\"slow\"}".to_vec(),
        ..Default::default()
    }
}

fn get(owner: &str, task_id: &str, include_outcome: bool) -> pb::GetTaskRequest {
    pb::GetTaskRequest {
        owner: owner.into(),
        task_id: task_id.into(),
        include_outcome,
    }
}

fn finish(
    owner: &str,
    task_id: &str,
    status: pb::TaskStatus,
    json: &[u8],
) -> pb::FinishTaskRequest {
    pb::FinishTaskRequest {
        owner: owner.into(),
        task_id: task_id.into(),
        status: status.into(),
        outcome: (!json.is_empty()).then(|| pb::TaskOutcome {
            kind: pb::task_outcome::Kind::Result.into(),
            json: json.to_vec(),
        }),
        ..Default::default()
    }
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect()
}

fn assert_code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, names: &str) {
    let err = r.unwrap_err();
    assert_eq!(err.code(), code, "{err:?}");
    assert!(
        err.message().contains(names),
        "{err:?} should name {names:?}"
    );
}

async fn task_of(c: &mut Client, owner: &str, task_id: &str) -> pb::Task {
    let r = c
        .get_task(get(owner, task_id, false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.verdict(), pb::TaskVerdict::TaskFound, "{r:?}");
    r.view.unwrap().task.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lives_through_its_whole_lifecycle() {
    let server = Server::start(&[]);
    let mut c = client(&server).await;
    let created = c
        .create_task(create("s:a", "t1", "r1"))
        .await
        .unwrap()
        .into_inner();
    assert!(created.created);
    let task = created.task.unwrap();
    assert_eq!(task.task_id, "t1");
    assert_eq!(task.status(), pb::TaskStatus::Working);
    assert_eq!(task.version, 1);
    assert_eq!(task.request_key, "r1");
    assert_eq!(task.ttl_ms, Some(3_600_000), "the server's default TTL");
    assert!(task.created_at_ms > 0 && task.last_updated_at_ms >= task.created_at_ms);

    // Idempotent by request key, whatever task id the retry names.
    let retry = c
        .create_task(create("s:a", "other", "r1"))
        .await
        .unwrap()
        .into_inner();
    assert!(!retry.created);
    assert_eq!(retry.task.unwrap(), task);
    assert_code(
        c.create_task(create("s:a", "t1", "r2")).await,
        Code::AlreadyExists,
        "t1",
    );

    let found = c
        .get_task(get("s:a", "t1", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.verdict(), pb::TaskVerdict::TaskFound);
    let view = found.view.unwrap();
    assert_eq!(view.task.unwrap(), task);
    assert!(view.outcome.is_none(), "no outcome while it runs");

    let updated = c
        .update_task(pb::UpdateTaskRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            expected_version: Some(1),
            status: pb::TaskStatus::Working.into(),
            status_message: Some("halfway".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let t = updated.task.unwrap();
    assert_eq!(
        (t.version, t.status_message.as_deref()),
        (2, Some("halfway"))
    );
    // A stale compare-and-set is ABORTED; an unspecified status is refused.
    let stale = pb::UpdateTaskRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
        expected_version: Some(1),
        status: pb::TaskStatus::Working.into(),
        ..Default::default()
    };
    assert_code(c.update_task(stale.clone()).await, Code::Aborted, "version");
    let unspecified = pb::UpdateTaskRequest {
        expected_version: None,
        status: pb::TaskStatus::Unspecified.into(),
        ..stale
    };
    assert_code(
        c.update_task(unspecified).await,
        Code::InvalidArgument,
        "status",
    );

    let asked = c
        .request_input(pb::RequestInputRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            requests: map(&[("k1", "{\"q\":1}"), ("k2", "{\"q\":2}")]),
            status_message: Some("need input".into()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(asked.task.unwrap().status(), pb::TaskStatus::InputRequired);
    let view = c
        .get_task(get("s:a", "t1", false))
        .await
        .unwrap()
        .into_inner()
        .view
        .unwrap();
    let mut keys: Vec<_> = view.outstanding.iter().map(|s| s.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["k1", "k2"]);
    assert!(view.outstanding.iter().all(|s| s.response.is_none()));

    let answered = c
        .answer_input(pb::AnswerInputRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            responses: map(&[("k1", "{\"a\":1}"), ("nope", "{}")]),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answered.accepted, ["k1"]);
    assert_eq!(answered.ignored, ["nope"]);
    assert_eq!(
        answered.task.unwrap().status(),
        pb::TaskStatus::InputRequired
    );
    // A retry of the same answer is harmless: ignored, not refused.
    let again = c
        .answer_input(pb::AnswerInputRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            responses: map(&[("k1", "{\"a\":1}"), ("k2", "{\"a\":2}")]),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (again.accepted, again.ignored),
        (vec!["k2".to_owned()], vec!["k1".to_owned()])
    );
    assert_eq!(
        again.task.unwrap().status(),
        pb::TaskStatus::Working,
        "the last answer resumes it"
    );

    let result = b"{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}";
    let done = c
        .finish_task(finish("s:a", "t1", pb::TaskStatus::Completed, result))
        .await
        .unwrap()
        .into_inner();
    assert!(!done.duplicate);
    let t = done.task.unwrap();
    assert_eq!(t.status(), pb::TaskStatus::Completed);
    assert_eq!(t.end_cause(), pb::TaskEndCause::Client);
    assert!(t.ended_at_ms.is_some());
    let retry = c
        .finish_task(finish("s:a", "t1", pb::TaskStatus::Completed, result))
        .await
        .unwrap()
        .into_inner();
    assert!(retry.duplicate, "restating the end is a duplicate");
    assert_code(
        c.finish_task(finish("s:a", "t1", pb::TaskStatus::Failed, b""))
            .await,
        Code::FailedPrecondition,
        "completed",
    );

    let with = c
        .get_task(get("s:a", "t1", true))
        .await
        .unwrap()
        .into_inner();
    let outcome = with.view.unwrap().outcome.unwrap();
    assert_eq!(outcome.kind(), pb::task_outcome::Kind::Result);
    assert_eq!(outcome.json, result);
    let without = c
        .get_task(get("s:a", "t1", false))
        .await
        .unwrap()
        .into_inner();
    assert!(without.view.unwrap().outcome.is_none());

    // A cancel of an ended task is acknowledged, not refused.
    let cancelled = c
        .cancel_task(pb::CancelTaskRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            mode: pb::cancel_task_request::Mode::Terminal.into(),
            status_message: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cancelled.already_terminal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owners_task_is_not_found_by_any_call() {
    let server = Server::start(&[]);
    let mut c = client(&server).await;
    c.create_task(create("s:a", "t1", "r1")).await.unwrap();
    let (o, t) = ("s:b", "t1");
    let view = c.get_task(get(o, t, true)).await.unwrap().into_inner();
    assert_eq!(view.verdict(), pb::TaskVerdict::TaskUnknown);
    assert!(view.view.is_none());
    let nf = "task not found";
    let update = pb::UpdateTaskRequest {
        owner: o.into(),
        task_id: t.into(),
        status: pb::TaskStatus::Working.into(),
        ..Default::default()
    };
    assert_code(c.update_task(update).await, Code::NotFound, nf);
    let ask = pb::RequestInputRequest {
        owner: o.into(),
        task_id: t.into(),
        requests: map(&[("k", "{}")]),
        status_message: None,
    };
    assert_code(c.request_input(ask).await, Code::NotFound, nf);
    let answer = pb::AnswerInputRequest {
        owner: o.into(),
        task_id: t.into(),
        responses: map(&[("k", "{}")]),
    };
    assert_code(c.answer_input(answer).await, Code::NotFound, nf);
    for mode in [
        pb::cancel_task_request::Mode::Request,
        pb::cancel_task_request::Mode::Terminal,
    ] {
        let cancel = pb::CancelTaskRequest {
            owner: o.into(),
            task_id: t.into(),
            mode: mode.into(),
            status_message: None,
        };
        assert_code(c.cancel_task(cancel).await, Code::NotFound, nf);
    }
    assert_code(
        c.finish_task(finish(o, t, pb::TaskStatus::Completed, b"{}"))
            .await,
        Code::NotFound,
        nf,
    );
    let delete = pb::DeleteTaskRequest {
        owner: o.into(),
        task_id: t.into(),
    };
    assert_code(c.delete_task(delete).await, Code::NotFound, nf);
    for owner in ["s:b", ""] {
        let list = pb::ListTasksRequest {
            owner: owner.into(),
            ..Default::default()
        };
        assert!(c
            .list_tasks(list)
            .await
            .unwrap()
            .into_inner()
            .tasks
            .is_empty());
    }
    // Nothing of that touched the owner's task.
    let mine = task_of(&mut c, "s:a", "t1").await;
    assert_eq!((mine.status(), mine.version), (pb::TaskStatus::Working, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_two_racing_finishes_wins() {
    let server = Server::start(&[]);
    let mut setup = client(&server).await;
    // Two connections, so the calls really run side by side.
    let (a, b) = (client(&server).await, client(&server).await);
    for round in 0..8 {
        let id = format!("race-{round}");
        setup.create_task(create("s:a", &id, &id)).await.unwrap();
        let (mut a, mut b) = (a.clone(), b.clone());
        let done = finish("s:a", &id, pb::TaskStatus::Completed, b"{\"ok\":true}");
        let cancel = finish("s:a", &id, pb::TaskStatus::Cancelled, b"");
        let (ra, rb) = tokio::join!(a.finish_task(done), b.finish_task(cancel));
        let (winner, loser) = match (ra, rb) {
            (Ok(_), Err(e)) => (pb::TaskStatus::Completed, e),
            (Err(e), Ok(_)) => (pb::TaskStatus::Cancelled, e),
            other => panic!("round {round}: exactly one end must win: {other:?}"),
        };
        assert_eq!(loser.code(), Code::FailedPrecondition, "{loser:?}");
        let name = if winner == pb::TaskStatus::Completed {
            "completed"
        } else {
            "cancelled"
        };
        assert!(
            loser.message().contains(name),
            "{loser:?} should name {name}"
        );
        let task = task_of(&mut setup, "s:a", &id).await;
        assert_eq!(task.status(), winner, "round {round}");
        assert_eq!(task.version, 2, "one end, one version");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_task_answers_deleted_and_frees_room_under_the_per_owner_cap() {
    let server = Server::start(&["--max-tasks-per-owner", "2"]);
    let mut c = client(&server).await;
    c.create_task(create("s:a", "t1", "r1")).await.unwrap();
    c.create_task(create("s:a", "t2", "r2")).await.unwrap();
    let full = c.create_task(create("s:a", "t3", "r3")).await.unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    for part in [
        "2",
        "--max-tasks-per-owner",
        "CURSORLOG_MAX_TASKS_PER_OWNER",
    ] {
        assert!(full.message().contains(part), "{full:?} should name {part}");
    }
    // The cap is per owner.
    c.create_task(create("s:b", "t3", "r3")).await.unwrap();

    let deleted = c
        .delete_task(pb::DeleteTaskRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(deleted.task.is_some());
    let view = c
        .get_task(get("s:a", "t1", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.verdict(), pb::TaskVerdict::TaskDeleted);
    assert!(view.deleted_at_ms.is_some());
    assert_eq!(
        view.final_status(),
        pb::TaskStatus::Working,
        "it was running"
    );
    let again = pb::DeleteTaskRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
    };
    assert_code(c.delete_task(again).await, Code::NotFound, "task not found");
    c.create_task(create("s:a", "t3", "r3")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_in_creation_order_and_a_bad_cursor_is_invalid_argument() {
    let server = Server::start(&[]);
    let mut c = client(&server).await;
    for i in 0..5 {
        let id = format!("t{i}");
        c.create_task(create("s:a", &id, &id)).await.unwrap();
    }
    let mut cursor = String::new();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = c
            .list_tasks(pb::ListTasksRequest {
                owner: "s:a".into(),
                cursor: cursor.clone(),
                page_size: 2,
            })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.tasks.len() <= 2);
        seen.extend(page.tasks.into_iter().map(|t| t.task_id));
        if page.next_cursor.is_empty() {
            break;
        }
        cursor = page.next_cursor;
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(seen, ["t0", "t1", "t2", "t3", "t4"]);
    assert_eq!(pages, 3);
    for bad in ["not a cursor", "AAAAAAAAAAB", "%%%"] {
        let r = c
            .list_tasks(pb::ListTasksRequest {
                owner: "s:a".into(),
                cursor: bad.into(),
                page_size: 2,
            })
            .await;
        assert_code(r, Code::InvalidArgument, "cursor");
    }
    let r = c
        .list_tasks(pb::ListTasksRequest {
            owner: "s:a".into(),
            cursor: String::new(),
            page_size: 1001,
        })
        .await;
    assert_code(r, Code::InvalidArgument, "page_size");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_task_survives_kill_9_right_after_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(dir.path(), &[]);
    let created = {
        let mut c = client(&server).await;
        c.create_task(create("s:a", "t1", "r1"))
            .await
            .unwrap()
            .into_inner()
    };
    server.kill();
    let server = Server::start_in(dir.path(), &[]);
    let mut c = client(&server).await;
    let task = task_of(&mut c, "s:a", "t1").await;
    assert_eq!(Some(task), created.task);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sit_behind_the_same_token_health_and_reflection() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = Server::start(&["--auth-token", "s3cret"]);
    let channel = server.channel().await;
    let r = TasksClient::new(channel.clone())
        .create_task(create("s:a", "t1", "r1"))
        .await;
    assert_eq!(r.unwrap_err().code(), Code::Unauthenticated);
    let mut authed =
        TasksClient::with_interceptor(channel.clone(), |mut req: tonic::Request<()>| {
            req.metadata_mut()
                .insert("authorization", "Bearer s3cret".parse().unwrap());
            Ok(req)
        });
    assert!(
        authed
            .create_task(create("s:a", "t1", "r1"))
            .await
            .unwrap()
            .into_inner()
            .created
    );

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "cursorlog.v1.Tasks".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        r.into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection response {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for name in ["cursorlog.v1.Tasks", "cursorlog.v1.CursorLog"] {
        assert!(names.contains(&name.to_owned()), "{names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_is_recorded_and_an_oversize_request_is_resource_exhausted() {
    // The smallest message limit the payload limit allows, as in status_codes.rs.
    let limit = 1024 + 64 * 1024;
    let server = Server::start(&[
        "--payload-bytes-max",
        "1024",
        "--grpc-message-bytes-max",
        &limit.to_string(),
    ]);
    let mut c = client(&server).await;
    c.create_task(create("s:a", "t1", "r1")).await.unwrap();
    let requested = c
        .cancel_task(pb::CancelTaskRequest {
            owner: "s:a".into(),
            task_id: "t1".into(),
            mode: pb::cancel_task_request::Mode::Request.into(),
            status_message: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!requested.already_terminal);
    let t = requested.task.unwrap();
    assert!(t.cancel_requested);
    assert_eq!(t.status(), pb::TaskStatus::Working, "the worker ends it");
    let unchosen = pb::CancelTaskRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
        mode: pb::cancel_task_request::Mode::Unspecified.into(),
        status_message: None,
    };
    assert_code(c.cancel_task(unchosen).await, Code::InvalidArgument, "mode");

    // The same frame limit as the event log: over it is RESOURCE_EXHAUSTED.
    let mut big = create("s:a", "t2", "r2");
    big.context = vec![b'x'; limit + 1];
    let err = c.create_task(big).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
}
