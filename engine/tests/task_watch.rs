//! Watching a task (docs/TASKS-DESIGN.md §1.9): the replica that runs a task learns of an
//! answer or a cancel that another caller wrote, from the commit's bell, and the watch ends
//! once it delivered the task's end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use cursorlog_engine::{
    CancelMode, Config, Engine, Error, NewTask, OutcomeKind, TaskCancel, TaskFinish,
    TaskInputAnswer, TaskInputRequest, TaskOutcome, TaskRef, TaskStatus, TaskVerdict,
};

fn open(dir: &std::path::Path) -> Engine {
    let mut c = Config::new(dir);
    c.retention.check_interval = Duration::from_secs(3600);
    c.background_expiry = false;
    Engine::open(c).unwrap()
}

fn create(e: &Engine, task_id: &str) -> TaskRef {
    e.create_task(NewTask {
        owner: "s:a".into(),
        task_id: task_id.into(),
        request_key: format!("r-{task_id}"),
        ttl_ms: None,
        poll_interval_ms: None,
        worker_lease_ms: None,
        status_message: None,
        context: Vec::new(),
    })
    .unwrap();
    TaskRef::new("s:a", task_id)
}

/// Runs a blocking engine call off the runtime's thread, as another replica's request.
async fn elsewhere<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test]
async fn a_watch_sees_an_answer_and_a_cancel_written_elsewhere_then_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let t = create(&e, "t");
    e.request_task_input(TaskInputRequest {
        task: t.clone(),
        requests: vec![("confirm".into(), b"{}".to_vec())],
        status_message: None,
    })
    .unwrap();
    let mut watch = e.watch_task(&t, 0).unwrap();
    let now = watch.next().await.unwrap().unwrap();
    assert_eq!(now.task.as_ref().unwrap().version, 2, "the task as it is");
    assert_eq!(now.outstanding.len(), 1);
    // Nothing new: the watch waits for a commit that touches the task.
    assert_eq!(watch.poll().unwrap(), None);
    let (e2, t2) = (e.clone(), t.clone());
    let waiting = tokio::spawn(async move {
        let view = watch.next().await.unwrap().unwrap();
        (watch, view)
    });
    elsewhere(move || {
        e2.answer_task_input(TaskInputAnswer {
            task: t2,
            responses: vec![("confirm".into(), b"{\"action\":\"accept\"}".to_vec())],
        })
        .unwrap()
    })
    .await;
    let (mut watch, answered) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the answer woke the watch")
        .unwrap();
    let task = answered.task.unwrap();
    assert_eq!(task.version, 3);
    assert_eq!(task.status, TaskStatus::Working);
    assert!(answered.outstanding.is_empty());
    let (e3, t3) = (e.clone(), t.clone());
    elsewhere(move || {
        e3.cancel_task(TaskCancel {
            task: t3,
            mode: CancelMode::Request,
            status_message: None,
        })
        .unwrap()
    })
    .await;
    let cancel = watch.next().await.unwrap().unwrap();
    assert!(cancel.task.unwrap().cancel_requested);
    let (e4, t4) = (e.clone(), t.clone());
    elsewhere(move || {
        e4.finish_task(TaskFinish {
            task: t4,
            expected_version: None,
            status: TaskStatus::Cancelled,
            status_message: None,
            outcome: TaskOutcome::none(),
        })
        .unwrap()
    })
    .await;
    let end = watch.next().await.unwrap().unwrap();
    assert_eq!(end.task.unwrap().status, TaskStatus::Cancelled);
    assert!(watch.is_done());
    assert_eq!(watch.next().await.unwrap(), None, "the end was delivered");
}

#[tokio::test]
async fn a_watch_from_the_last_version_seen_loses_nothing_and_ends_after_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let t = create(&e, "t");
    e.finish_task(TaskFinish {
        task: t.clone(),
        expected_version: None,
        status: TaskStatus::Completed,
        status_message: None,
        outcome: TaskOutcome {
            kind: OutcomeKind::Result,
            json: b"{\"ok\":true}".to_vec(),
        },
    })
    .unwrap();
    // A client that last saw version 1 (working) gets the end, with its outcome.
    let mut behind = e.watch_task(&t, 1).unwrap();
    let end = behind.next().await.unwrap().unwrap();
    assert_eq!(end.outcome.unwrap().json, b"{\"ok\":true}".to_vec());
    assert_eq!(behind.next().await.unwrap(), None);
    // One that saw the end already is done at once.
    let mut caught_up = e.watch_task(&t, 2).unwrap();
    assert_eq!(caught_up.next().await.unwrap(), None);
}

#[tokio::test]
async fn a_deletion_ends_a_watch_and_unknown_tasks_cannot_be_watched() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let t = create(&e, "t");
    let mut watch = e.watch_task(&t, 1).unwrap();
    let (e2, t2) = (e.clone(), t.clone());
    elsewhere(move || e2.delete_task(t2).unwrap()).await;
    let gone = watch.next().await.unwrap().unwrap();
    assert_eq!(gone.verdict, TaskVerdict::Deleted);
    assert_eq!(watch.next().await.unwrap(), None);
    assert!(matches!(
        e.watch_task(&TaskRef::new("s:b", "t"), 0),
        Err(Error::UnknownTask { .. })
    ));
    assert!(matches!(
        e.watch_task(&TaskRef::new("s:a", "never"), 0),
        Err(Error::UnknownTask { .. })
    ));
}

#[tokio::test]
async fn a_waiting_watch_ends_with_closed_when_the_engine_closes() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let t = create(&e, "t");
    let mut watch = e.watch_task(&t, 1).unwrap();
    let waiting = tokio::spawn(async move { watch.next().await });
    tokio::task::yield_now().await;
    let closer = e.clone();
    elsewhere(move || closer.close()).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("close woke the watch")
        .unwrap();
    assert!(matches!(ended, Err(Error::Closed)), "{ended:?}");
}

#[tokio::test]
async fn an_enqueue_wakes_a_watch_and_an_ended_task_is_watched_until_drained() {
    use cursorlog_engine::{TaskDequeue, TaskEnqueue, OUTBOUND};
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let t = create(&e, "t");
    let mut watch = e.watch_task(&t, 1).unwrap();
    assert_eq!(watch.poll().unwrap(), None, "nothing new yet");
    let (e2, t2) = (e.clone(), t.clone());
    elsewhere(move || {
        e2.enqueue_task_message(TaskEnqueue {
            task: t2,
            channel: OUTBOUND,
            message: b"{\"method\":\"elicitation/create\"}".to_vec(),
            max_len: 0,
            dedupe_key: None,
            correlation: Some("7".into()),
        })
        .unwrap()
    })
    .await;
    let queued = watch.next().await.unwrap().unwrap();
    assert_eq!(queued.outbound_queued, 1);
    e.finish_task(TaskFinish {
        task: t.clone(),
        expected_version: None,
        status: TaskStatus::Completed,
        status_message: None,
        outcome: TaskOutcome::none(),
    })
    .unwrap();
    let ended = watch.next().await.unwrap().unwrap();
    assert_eq!(ended.task.unwrap().status, TaskStatus::Completed);
    assert!(!watch.is_done(), "a message is still queued");
    e.dequeue_task_messages(TaskDequeue {
        task: t,
        channel: OUTBOUND,
        max_messages: 0,
        token: "tok".into(),
    })
    .unwrap();
    assert_eq!(
        watch.next().await.unwrap(),
        None,
        "drained: the watch is over"
    );
}
