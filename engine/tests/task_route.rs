//! The inbound route of a task's answers (docs/TASKS-DESIGN.md §1.6, channel 1): an outbound
//! request enqueued with a correlation opens a route (owner, correlation) → task; routing the
//! client's answer appends it to that task's inbound queue once, a retry answers `duplicate`
//! with the same qseq, and the route survives a restart, a rebuild and the retirement of the
//! segments it was written in, until its task is deleted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Engine, Error, NewEvent, NewTask, OpenStream, OutcomeKind, TaskDequeue,
    TaskEnqueue, TaskFinish, TaskOutcome, TaskRef, TaskRoute, TaskRouted, TaskStatus, INBOUND,
    OUTBOUND,
};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = Duration::from_secs(3600);
    c.background_expiry = false;
    c
}

fn create(e: &Engine, owner: &str, task_id: &str) -> TaskRef {
    e.create_task(NewTask {
        owner: owner.into(),
        task_id: task_id.into(),
        request_key: format!("r-{task_id}"),
        ttl_ms: None,
        poll_interval_ms: None,
        worker_lease_ms: None,
        status_message: None,
        context: Vec::new(),
    })
    .unwrap();
    TaskRef::new(owner, task_id)
}

/// Replica A's SDK enqueues an elicitation request with JSON-RPC id `correlation`.
fn ask(e: &Engine, task: &TaskRef, correlation: &str) -> u64 {
    e.enqueue_task_message(TaskEnqueue {
        task: task.clone(),
        channel: OUTBOUND,
        message: format!(r#"{{"id":{correlation:?},"method":"elicitation/create"}}"#).into_bytes(),
        max_len: 0,
        dedupe_key: None,
        correlation: Some(correlation.into()),
    })
    .unwrap()
    .qseq
}

fn route(owner: &str, correlation: &str, answer: &str) -> TaskRoute {
    TaskRoute {
        owner: owner.into(),
        correlation: correlation.into(),
        message: answer.as_bytes().to_vec(),
    }
}

fn routed(task_id: &str, qseq: u64, duplicate: bool) -> TaskRouted {
    TaskRouted {
        routed: true,
        task_id: task_id.into(),
        qseq,
        duplicate,
    }
}

fn not_routed() -> TaskRouted {
    TaskRouted {
        routed: false,
        task_id: String::new(),
        qseq: 0,
        duplicate: false,
    }
}

/// The inbound messages of `task`, taken (FIFO).
fn take_inbound(e: &Engine, task: &TaskRef, token: &str) -> Vec<(String, Option<String>)> {
    e.dequeue_task_messages(TaskDequeue {
        task: task.clone(),
        channel: INBOUND,
        max_messages: 0,
        token: token.into(),
    })
    .unwrap()
    .messages
    .into_iter()
    .map(|m| (String::from_utf8(m.message).unwrap(), m.correlation))
    .collect()
}

/// How many index entries the engine's log has appended so far (a write adds some).
fn log_len(e: &Engine) -> u64 {
    e.stats().unwrap().last_lsn
}

#[test]
fn an_answer_routes_once_to_the_task_that_asked_and_a_retry_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let t = create(&e, "s:a", "t");
    let other = create(&e, "s:a", "other");
    ask(&e, &t, "7");
    ask(&e, &other, "8");
    let first = e.route_task_message(route("s:a", "7", "yes")).unwrap();
    assert_eq!(first, routed("t", 1, false));
    let before = log_len(&e);
    // A retry after an unknown outcome: the same task and qseq, nothing written.
    let again = e.route_task_message(route("s:a", "7", "yes")).unwrap();
    assert_eq!(again, routed("t", 1, true));
    assert_eq!(log_len(&e), before, "a duplicate writes nothing");
    // Each answer goes to its own task's inbound queue, FIFO, with its correlation.
    assert_eq!(
        e.route_task_message(route("s:a", "8", "no")).unwrap(),
        routed("other", 1, false)
    );
    ask(&e, &t, "9");
    assert_eq!(
        e.route_task_message(route("s:a", "9", "maybe")).unwrap(),
        routed("t", 2, false)
    );
    assert_eq!(
        take_inbound(&e, &t, "k1"),
        [
            ("yes".to_owned(), Some("7".to_owned())),
            ("maybe".to_owned(), Some("9".to_owned()))
        ]
    );
    assert_eq!(
        take_inbound(&e, &other, "k2"),
        [("no".to_owned(), Some("8".to_owned()))]
    );
    // Taken or not, the answered route still answers a retry with its qseq.
    assert_eq!(
        e.route_task_message(route("s:a", "9", "maybe")).unwrap(),
        routed("t", 2, true)
    );
}

#[test]
fn nothing_routes_without_an_open_route_of_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let t = create(&e, "s:a", "t");
    ask(&e, &t, "7");
    let before = log_len(&e);
    // Never asked.
    assert_eq!(
        e.route_task_message(route("s:a", "6", "x")).unwrap(),
        not_routed()
    );
    // Another owner's correlation is never this owner's route.
    assert_eq!(
        e.route_task_message(route("s:b", "7", "x")).unwrap(),
        not_routed()
    );
    assert_eq!(
        e.route_task_message(route("", "7", "x")).unwrap(),
        not_routed()
    );
    assert_eq!(log_len(&e), before, "nothing was written");
    assert!(take_inbound(&e, &t, "k").is_empty());
    // The owner's own answer still routes.
    assert_eq!(
        e.route_task_message(route("s:a", "7", "x")).unwrap(),
        routed("t", 1, false)
    );
    // An ended task's open route routes nothing (its worker waits no more).
    ask(&e, &t, "10");
    e.finish_task(TaskFinish {
        task: t.clone(),
        status: TaskStatus::Completed,
        status_message: None,
        outcome: TaskOutcome {
            kind: OutcomeKind::Result,
            json: b"{}".to_vec(),
        },
        expected_version: None,
    })
    .unwrap();
    assert_eq!(
        e.route_task_message(route("s:a", "10", "late")).unwrap(),
        not_routed()
    );
    // ... while the answered one still answers its retry.
    assert_eq!(
        e.route_task_message(route("s:a", "7", "x")).unwrap(),
        routed("t", 1, true)
    );
}

#[test]
fn an_inbound_enqueue_cannot_pose_as_a_routed_answer_and_ids_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let t = create(&e, "s:a", "t");
    let u = create(&e, "s:a", "u");
    ask(&e, &t, "7");
    let forged = e
        .enqueue_task_message(TaskEnqueue {
            task: t.clone(),
            channel: INBOUND,
            message: b"x".to_vec(),
            max_len: 0,
            dedupe_key: None,
            correlation: Some("7".into()),
        })
        .unwrap_err();
    assert!(
        matches!(&forged, Error::InvalidArgument { field, .. } if *field == "correlation"),
        "{forged:?}"
    );
    // The same request again for the same task (a retried enqueue) is fine; another task
    // cannot take the owner's correlation.
    ask(&e, &t, "7");
    let taken = e
        .enqueue_task_message(TaskEnqueue {
            task: u,
            channel: OUTBOUND,
            message: b"{}".to_vec(),
            max_len: 0,
            dedupe_key: None,
            correlation: Some("7".into()),
        })
        .unwrap_err();
    assert!(
        matches!(&taken, Error::InvalidArgument { field, .. } if *field == "correlation"),
        "{taken:?}"
    );
    assert_eq!(
        e.route_task_message(route("s:a", "7", "ok")).unwrap(),
        routed("t", 1, false)
    );
}

#[test]
fn a_full_inbound_queue_refuses_the_route_as_an_enqueue_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.tasks.queue_len_max = 1;
    let e = Engine::open(c).unwrap();
    let t = create(&e, "s:a", "t");
    for (i, id) in ["1", "2"].into_iter().enumerate() {
        ask(&e, &t, id);
        // The client takes each request off the (one-message) outbound queue.
        e.dequeue_task_messages(TaskDequeue {
            task: t.clone(),
            channel: OUTBOUND,
            max_messages: 0,
            token: format!("out-{i}"),
        })
        .unwrap();
    }
    e.route_task_message(route("s:a", "1", "a")).unwrap();
    let full = e.route_task_message(route("s:a", "2", "b")).unwrap_err();
    assert!(matches!(full, Error::TaskQueueFull { .. }), "{full:?}");
    // Refused, the route stays open: once the queue has room it routes.
    take_inbound(&e, &t, "k");
    assert_eq!(
        e.route_task_message(route("s:a", "2", "b")).unwrap(),
        routed("t", 2, false)
    );
}

#[test]
fn a_task_holds_at_most_4096_routes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.sync = cursorlog_engine::SyncPolicy::Never;
    c.segment_bytes_max = 64 << 20;
    let e = Engine::open(c).unwrap();
    let t = create(&e, "s:a", "t");
    for i in 0..4096 {
        ask(&e, &t, &i.to_string());
        if i % 1000 == 999 {
            // The client takes the requests, so only the route cap is in the way.
            e.dequeue_task_messages(TaskDequeue {
                task: t.clone(),
                channel: OUTBOUND,
                max_messages: 0,
                token: format!("out-{i}"),
            })
            .unwrap();
        }
    }
    let full = e
        .enqueue_task_message(TaskEnqueue {
            task: t.clone(),
            channel: OUTBOUND,
            message: b"{}".to_vec(),
            max_len: 0,
            dedupe_key: None,
            correlation: Some("4096".into()),
        })
        .unwrap_err();
    assert!(
        matches!(
            full,
            Error::TaskQueueFull {
                what: "routes",
                queued: 4097,
                max: 4096,
                ..
            }
        ),
        "{full:?}"
    );
    // A message that is no request (no correlation) still goes.
    e.enqueue_task_message(TaskEnqueue {
        task: t.clone(),
        channel: OUTBOUND,
        message: b"{}".to_vec(),
        max_len: 0,
        dedupe_key: None,
        correlation: None,
    })
    .unwrap();
}

#[tokio::test]
async fn a_watch_of_the_task_wakes_on_a_routed_answer() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let t = create(&e, "s:a", "t");
    ask(&e, &t, "7");
    let mut watch = e.watch_task(&t, 0).unwrap();
    let now = watch.next().await.unwrap().unwrap();
    assert_eq!(now.inbound_queued, 0);
    assert_eq!(watch.poll().unwrap(), None);
    let waiting = tokio::spawn(async move { watch.next().await.unwrap().unwrap() });
    let e2 = e.clone();
    tokio::task::spawn_blocking(move || e2.route_task_message(route("s:a", "7", "yes")).unwrap())
        .await
        .unwrap();
    let view = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the routed answer woke the watch")
        .unwrap();
    assert_eq!(view.inbound_queued, 1);
}

#[test]
fn routes_survive_a_restart_retention_and_a_rebuild_and_go_with_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let kept = create(&e, "s:a", "kept");
    let gone = create(&e, "s:a", "gone");
    ask(&e, &kept, "open");
    ask(&e, &kept, "answered");
    ask(&e, &gone, "g");
    e.route_task_message(route("s:a", "answered", "a")).unwrap();
    e.delete_task(gone.clone()).unwrap();
    assert_eq!(
        e.route_task_message(route("s:a", "g", "x")).unwrap(),
        not_routed(),
        "a deleted task's routes went with it"
    );
    // Retire the segments the routes were written in.
    let s = e.open_session("filler").unwrap();
    let stream = e
        .open_stream(OpenStream {
            session: "filler".into(),
            epoch: s.epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    for _ in 0..40 {
        e.append(Append {
            session: "filler".into(),
            stream,
            expected_next_seq: None,
            events: vec![NewEvent::new("p", vec![7u8; 200])],
        })
        .unwrap();
    }
    e.trim("filler", stream, u64::MAX).unwrap();
    assert!(e.run_retention().unwrap() >= 2);
    let kept_id = e.task(&kept, false).unwrap().task.unwrap().id;
    let gone_id = e.task(&gone, false).unwrap().task.unwrap().id;
    assert_eq!(route_keys(&e, kept_id), 2, "both routes carried forward");
    e.close().unwrap();
    drop(e);
    // A restart keeps them ...
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(route_keys(&e, kept_id), 2);
    e.simulate_crash();
    drop(e);
    // ... and so does a rebuild from the log, whose first segments are gone.
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(e.recovery_report().index_rebuilt);
    assert_eq!(route_keys(&e, gone_id), 0);
    assert_eq!(
        e.route_task_message(route("s:a", "answered", "a")).unwrap(),
        routed("kept", 1, true),
        "the answered route still answers a retry"
    );
    assert_eq!(
        e.route_task_message(route("s:a", "open", "b")).unwrap(),
        routed("kept", 2, false),
        "the open route still routes"
    );
    assert_eq!(
        e.route_task_message(route("s:a", "g", "x")).unwrap(),
        not_routed()
    );
    assert_eq!(take_inbound(&e, &kept, "k").len(), 2);
    // Deletion takes the routes with the content.
    e.delete_task(kept.clone()).unwrap();
    assert_eq!(route_keys(&e, kept_id), 0);
    assert_eq!(
        e.route_task_message(route("s:a", "answered", "a")).unwrap(),
        not_routed()
    );
    assert!(
        !e.index_dump()
            .unwrap()
            .iter()
            .any(|(k, _)| k[0] == b'W' || k[0] == b'V'),
        "no route of any task is left, nor a count"
    );
}

/// The `V` index keys of the engine id `id`'s routes (one per correlation; its count key,
/// `V` id alone, is left out).
fn route_keys(e: &Engine, id: u64) -> usize {
    e.index_dump()
        .unwrap()
        .iter()
        .filter(|(k, _)| k[0] == b'V' && k.len() > 9 && k.get(1..9) == Some(&id.to_be_bytes()[..]))
        .count()
}
